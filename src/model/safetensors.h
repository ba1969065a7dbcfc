// Safetensors files and Hugging Face checkpoint directories.
//
// File layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N bytes of
// JSON header {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
// {str: str}}, then the data section; offsets are relative to the data section (byte 8 + N). Every header is
// validated in full before any tensor is used; errors name the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"

namespace kvq {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType dtype);            // bytes per element
std::string_view dtype_name(DType dtype);  // the safetensors spelling: "BF16", "F32", ...
// Parses a safetensors dtype name; throws kvq::Error listing the supported names (where: the input it came from).
DType parse_dtype(std::string_view name, std::string_view where);

struct TensorInfo {
  std::string name;            // tensor name as written in the header
  DType dtype = DType::F32;    // element type
  std::vector<int64_t> shape;  // dims, each >= 0; empty for a scalar
  size_t begin = 0, end = 0;   // byte range [begin, end) relative to the data section
  int64_t numel() const;       // product of shape (1 for a scalar)
  size_t nbytes() const { return end - begin; }
};

struct SafeTensorsHeader {
  std::vector<TensorInfo> tensors;              // every tensor, sorted by begin offset
  std::map<std::string, std::string> metadata;  // the "__metadata__" map (empty when absent)
  size_t data_start = 0;                        // absolute offset of the data section: 8 + header length
};

// Largest accepted JSON header (the limit of the reference implementation).
constexpr size_t kMaxSafeTensorsHeaderBytes = 100'000'000;

// Parses and validates the header of a safetensors file held in memory (size: the whole file's length, so
// data offsets are checked against it). where names the input in error messages.
SafeTensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, std::string_view where);

// A memory-mapped, validated safetensors file.
class SafeTensorsFile {
 public:
  static std::unique_ptr<SafeTensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const SafeTensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const TensorInfo& at(std::string_view name) const;    // throws kvq::Error naming the file when absent
  const uint8_t* data(const TensorInfo& info) const { return file_.data() + header_.data_start + info.begin; }
  const MappedFile& mapping() const { return file_; }

 private:
  SafeTensorsFile(MappedFile file, SafeTensorsHeader header);

  MappedFile file_;                                   // the whole file, mapped read-only
  SafeTensorsHeader header_;                          // validated header
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

// A tensor inside a mapping; data is not necessarily aligned.
struct TensorRef {
  const TensorInfo* info = nullptr;  // name, dtype, shape
  const uint8_t* data = nullptr;     // info->nbytes() bytes inside the mapping
  const SafeTensorsFile* file = nullptr;  // the shard it lies in (null for a TensorRef made by hand)
};

// Converts F32 / F16 / BF16 elements [first, first + count) to fp32; any other dtype throws naming the tensor.
void to_f32(const TensorRef& t, size_t first, size_t count, float* dst);
void to_f32(const TensorRef& t, float* dst);  // all numel() elements
std::vector<float> to_f32(const TensorRef& t);

// A tensor owned in memory, for writing.
struct OwnedTensor {
  std::string name;            // tensor name
  DType dtype = DType::F32;    // element type of bytes
  std::vector<int64_t> shape;  // dims
  std::vector<uint8_t> bytes;  // numel * dtype_size bytes, little-endian

  // Encodes fp32 values as F64 / F32 / F16 / BF16 (round to nearest even); other dtypes throw.
  static OwnedTensor from_f32(std::string name, DType dtype, std::vector<int64_t> shape,
                              const std::vector<float>& values);
};

// A complete safetensors file in memory: tensors are laid out by decreasing element size (each tensor aligned to
// its element size, no gaps, as the reference writer does) and the header is padded with spaces so the data
// section starts at a multiple of 8. Throws kvq::Error on duplicate names or bytes/shape mismatches.
std::vector<uint8_t> serialize_safetensors(const std::vector<OwnedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata);
// Writes serialize_safetensors(...) to path (through a temporary file renamed into place).
void write_safetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// The weight map of a sharded checkpoint's model.safetensors.index.json (its text; path names it in errors): tensor
// name -> shard file name, each a plain file name (no directory part). Throws kvq::Error naming the problem.
std::map<std::string, std::string> parse_safetensors_index(std::string_view text, const std::string& path);

// A Hugging Face checkpoint directory: config.json plus either model.safetensors or
// model.safetensors.index.json and the shards it names. Every shard header and the index are validated on open.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  // Whether dir holds weights at all (model.safetensors or model.safetensors.index.json): a config without them,
  // as models/shapes/, is still a model's shapes (kvq info, --dummy-weights).
  static bool has_weights(const std::string& dir);

  bool has(std::string_view name) const;
  TensorRef get(std::string_view name) const;  // throws kvq::Error naming the tensor and directory when absent
  std::vector<std::string> names() const;      // every tensor name, sorted
  // SHA-256 hex of config.json, the name / dtype / shape of every tensor and the first 256 bytes of each
  // tensor's data (a cheap guard against two fine-tunes with identical headers). Independent of sharding and
  // header formatting; reads no more than 256 bytes per tensor, so it is fast. Computed on open.
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  const std::vector<std::shared_ptr<const SafeTensorsFile>>& shards() const { return shards_; }

 private:
  std::string dir_;                                             // the directory as given
  std::vector<std::shared_ptr<const SafeTensorsFile>> shards_;  // open shards (one for a single-file checkpoint)
  std::map<std::string, TensorRef, std::less<>> tensors_;       // name -> tensor inside its shard
  std::string fingerprint_;                                     // see fingerprint()
};

}  // namespace kvq
