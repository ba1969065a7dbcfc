#include "model/safetensors.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/half.h"
#include "common/sha256.h"

namespace kvq {
namespace {

using json = nlohmann::json;

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeEntry, 10> kDTypes = {{{DType::F64, "F64", 8},
                                                 {DType::F32, "F32", 4},
                                                 {DType::F16, "F16", 2},
                                                 {DType::BF16, "BF16", 2},
                                                 {DType::I64, "I64", 8},
                                                 {DType::I32, "I32", 4},
                                                 {DType::I16, "I16", 2},
                                                 {DType::I8, "I8", 1},
                                                 {DType::U8, "U8", 1},
                                                 {DType::BOOL, "BOOL", 1}}};

const DTypeEntry& dtype_entry(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  KVQ_FAIL("invalid DType value {}", int(dtype));
}

// Throws a kvq::Error "where: tensor 'name': msg" (or "where: msg" when tensor is empty).
[[noreturn]] void header_fail(std::string_view where, std::string_view tensor, const std::string& msg) {
  if (tensor.empty()) throw Error(fmt::format("{}: {}", where, msg), std::string(where));
  throw Error(fmt::format("{}: tensor '{}': {}", where, tensor, msg), std::string(where));
}

// A JSON integer in [0, 2^63); anything else throws.
int64_t json_nonneg_int(const json& v, std::string_view where, std::string_view tensor, std::string_view field) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(std::numeric_limits<int64_t>::max())) return int64_t(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return i;
  }
  header_fail(where, tensor, fmt::format("{} must hold non-negative integers, got {}", field, v.dump()));
}

// Number of elements of shape, or nullopt-like -1 when the product overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, size_t data_size, std::string_view where) {
  if (name.empty()) header_fail(where, name, "empty tensor name");
  if (!entry.is_object()) {
    header_fail(where, name, fmt::format("entry must be a JSON object, got {}", entry.type_name()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) header_fail(where, name, fmt::format("missing field '{}'", field));
  }
  TensorInfo info;
  info.name = name;
  const json& dtype = entry["dtype"];
  if (!dtype.is_string()) header_fail(where, name, fmt::format("dtype must be a string, got {}", dtype.dump()));
  try {
    info.dtype = parse_dtype(dtype.get<std::string>(), "");
  } catch (const Error& e) {
    header_fail(where, name, e.what());
  }

  const json& shape = entry["shape"];
  if (!shape.is_array()) header_fail(where, name, fmt::format("shape must be an array, got {}", shape.dump()));
  if (shape.size() > 64) header_fail(where, name, fmt::format("shape has {} dims (at most 64)", shape.size()));
  for (const json& d : shape) info.shape.push_back(json_nonneg_int(d, where, name, "shape"));

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    header_fail(where, name, fmt::format("data_offsets must be [begin, end], got {}", offsets.dump()));
  }
  const int64_t begin = json_nonneg_int(offsets[0], where, name, "data_offsets");
  const int64_t end = json_nonneg_int(offsets[1], where, name, "data_offsets");
  if (begin > end) header_fail(where, name, fmt::format("data_offsets [{}, {}] have begin > end", begin, end));
  if (uint64_t(end) > data_size) {
    header_fail(where, name,
                fmt::format("data_offsets [{}, {}] run past the end of the data section ({} bytes)", begin, end,
                            data_size));
  }
  info.begin = size_t(begin);
  info.end = size_t(end);

  const int64_t numel = checked_numel(info.shape);
  const size_t esize = dtype_size(info.dtype);
  if (numel < 0 || uint64_t(numel) > std::numeric_limits<uint64_t>::max() / esize) {
    header_fail(where, name, fmt::format("shape {} overflows: numel * dtype size does not fit in 64 bits",
                                         shape.dump()));
  }
  if (uint64_t(numel) * esize != info.nbytes()) {
    header_fail(where, name,
                fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {} bytes", shape.dump(),
                            dtype_name(info.dtype), uint64_t(numel) * esize, begin, end, info.nbytes()));
  }
  return info;
}

std::map<std::string, std::string> parse_metadata(const json& m, std::string_view where) {
  if (!m.is_object()) header_fail(where, "", fmt::format("__metadata__ must be an object, got {}", m.type_name()));
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string()) {
      header_fail(where, "", fmt::format("__metadata__ value of '{}' must be a string, got {}", k, v.dump()));
    }
    out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace

size_t dtype_size(DType dtype) { return dtype_entry(dtype).size; }

std::string_view dtype_name(DType dtype) { return dtype_entry(dtype).name; }

DType parse_dtype(std::string_view name, std::string_view where) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  std::string supported;
  for (const auto& e : kDTypes) supported += fmt::format("{}{}", supported.empty() ? "" : ", ", e.name);
  throw Error(fmt::format("{}{}unknown dtype '{}' (supported: {})", where, where.empty() ? "" : ": ", name, supported),
              std::string(where));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafeTensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, std::string_view where) {
  if (size < 8) {
    header_fail(where, "", fmt::format("file is truncated: {} bytes, too short for the 8-byte header length", size));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxSafeTensorsHeaderBytes) {
    header_fail(where, "", fmt::format("header length {} exceeds the {} byte limit", header_len,
                                       kMaxSafeTensorsHeaderBytes));
  }
  if (header_len > size - 8) {
    header_fail(where, "", fmt::format("header length {} runs past the end of the file ({} bytes): truncated?",
                                       header_len, size));
  }
  SafeTensorsHeader header;
  header.data_start = 8 + size_t(header_len);
  const size_t data_size = size - header.data_start;

  // Parse with a callback that bounds the nesting depth and rejects duplicate tensor names (nlohmann would
  // silently keep the last one).
  std::set<std::string> seen;
  const json::parser_callback_t guard = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > 8) header_fail(where, "", "header JSON nests deeper than 8 levels");
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) header_fail(where, key, "duplicate tensor name in header");
    }
    return true;
  };
  json root;
  try {
    root = json::parse(data + 8, data + header.data_start, guard);
  } catch (const json::exception& e) {
    header_fail(where, "", fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!root.is_object()) header_fail(where, "", fmt::format("header must be a JSON object, got {}", root.type_name()));

  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      header.metadata = parse_metadata(entry, where);
    } else {
      header.tensors.push_back(parse_tensor_entry(name, entry, data_size, where));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < header.tensors.size(); ++i) {
    const TensorInfo& prev = header.tensors[i - 1];
    const TensorInfo& cur = header.tensors[i];
    if (cur.begin < prev.end && cur.nbytes() > 0) {
      header_fail(where, cur.name,
                  fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", cur.begin, cur.end, prev.name,
                              prev.begin, prev.end));
    }
  }
  return header;
}

// ---------------------------------------------------------------------------------------------------------------
// SafeTensorsFile

SafeTensorsFile::SafeTensorsFile(MappedFile file, SafeTensorsHeader header)
    : file_(std::move(file)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

std::unique_ptr<SafeTensorsFile> SafeTensorsFile::open(const std::string& path) {
  MappedFile file(path);
  SafeTensorsHeader header = parse_safetensors_header(file.data(), file.size(), path);
  return std::unique_ptr<SafeTensorsFile>(new SafeTensorsFile(std::move(file), std::move(header)));
}

const TensorInfo* SafeTensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafeTensorsFile::at(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info) throw Error(fmt::format("{}: no tensor named '{}'", path(), name), path());
  return *info;
}

// ---------------------------------------------------------------------------------------------------------------
// Conversion to fp32

void to_f32(const TensorRef& t, size_t first, size_t count, float* dst) {
  KVQ_CHECK(t.info && t.data, "to_f32 on an empty TensorRef");
  const TensorInfo& info = *t.info;
  KVQ_CHECK(first <= size_t(info.numel()) && count <= size_t(info.numel()) - first,
            "to_f32: elements [{}, {}) outside tensor '{}' of {} elements", first, first + count, info.name,
            info.numel());
  switch (info.dtype) {
    case DType::F32:
      std::memcpy(dst, t.data + 4 * first, 4 * count);
      return;
    case DType::BF16: {
      const uint8_t* src = t.data + 2 * first;
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case DType::F16: {
      const uint8_t* src = t.data + 2 * first;
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_f32(h);
      }
      return;
    }
    default:
      throw Error(fmt::format("tensor '{}' has dtype {}; only F32, F16 and BF16 convert to fp32", info.name,
                              dtype_name(info.dtype)),
                  KVQ_WHERE);
  }
}

void to_f32(const TensorRef& t, float* dst) { to_f32(t, 0, size_t(t.info->numel()), dst); }

std::vector<float> to_f32(const TensorRef& t) {
  KVQ_CHECK(t.info, "to_f32 on an empty TensorRef");
  std::vector<float> out(size_t(t.info->numel()));
  to_f32(t, out.data());
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Writing

OwnedTensor OwnedTensor::from_f32(std::string name, DType dtype, std::vector<int64_t> shape,
                                  const std::vector<float>& values) {
  const int64_t numel = checked_numel(shape);
  KVQ_CHECK(numel >= 0 && size_t(numel) == values.size(), "tensor '{}': shape has {} elements but {} values given",
            name, numel, values.size());
  OwnedTensor t{std::move(name), dtype, std::move(shape), {}};
  t.bytes.resize(values.size() * dtype_size(dtype));
  uint8_t* out = t.bytes.data();
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::F64: {
        const double v = values[i];
        std::memcpy(out + 8 * i, &v, 8);
        break;
      }
      case DType::F32:
        std::memcpy(out + 4 * i, &values[i], 4);
        break;
      case DType::F16: {
        const fp16_t h = f32_to_fp16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DType::BF16: {
        const bf16_t h = f32_to_bf16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      default:
        KVQ_FAIL("tensor '{}': OwnedTensor::from_f32 cannot encode dtype {}", t.name, dtype_name(dtype));
    }
  }
  return t;
}

namespace {

// Validates the tensors and returns the padded header text (without the 8-byte length) and the order in which
// the tensors' bytes follow it: largest element size first keeps every tensor aligned to its element size
// without gaps.
std::string layout_safetensors(const std::vector<OwnedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata, std::vector<size_t>* order) {
  std::set<std::string_view> names;
  for (const OwnedTensor& t : tensors) {
    KVQ_CHECK(!t.name.empty() && t.name != "__metadata__", "cannot write a tensor named '{}'", t.name);
    KVQ_CHECK(names.insert(t.name).second, "duplicate tensor name '{}' in write_safetensors", t.name);
    const int64_t numel = checked_numel(t.shape);
    KVQ_CHECK(numel >= 0 && std::all_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d >= 0; }),
              "tensor '{}': invalid shape", t.name);
    KVQ_CHECK(size_t(numel) * dtype_size(t.dtype) == t.bytes.size(),
              "tensor '{}': shape needs {} bytes of {} but {} given", t.name, size_t(numel) * dtype_size(t.dtype),
              dtype_name(t.dtype), t.bytes.size());
  }
  order->resize(tensors.size());
  for (size_t i = 0; i < order->size(); ++i) (*order)[i] = i;
  std::stable_sort(order->begin(), order->end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (size_t i : *order) {
    const OwnedTensor& t = tensors[i];
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

std::array<uint8_t, 8> le_u64(uint64_t v) {
  std::array<uint8_t, 8> out;
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(v >> (8 * i));
  return out;
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const std::vector<OwnedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> order;
  const std::string text = layout_safetensors(tensors, metadata, &order);
  size_t total = 8 + text.size();
  for (const OwnedTensor& t : tensors) total += t.bytes.size();
  std::vector<uint8_t> out(total);
  const auto len = le_u64(text.size());
  std::memcpy(out.data(), len.data(), 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* dst = out.data() + 8 + text.size();
  for (size_t i : order) {
    if (!tensors[i].bytes.empty()) std::memcpy(dst, tensors[i].bytes.data(), tensors[i].bytes.size());
    dst += tensors[i].bytes.size();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> order;
  const std::string text = layout_safetensors(tensors, metadata, &order);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)), path);
    const auto len = le_u64(text.size());
    out.write(reinterpret_cast<const char*>(len.data()), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (size_t i : order) {
      out.write(reinterpret_cast<const char*>(tensors[i].bytes.data()), std::streamsize(tensors[i].bytes.size()));
    }
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("cannot write '{}'", tmp), path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err)), path);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoint directories

namespace {

namespace fs = std::filesystem;

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::string_view text, const std::string& path) {
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: index is not valid JSON: {}", path, e.what()), path);
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw Error(fmt::format("{}: index has no \"weight_map\" object", path), path);
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      throw Error(fmt::format("{}: weight_map entry '{}' must be a shard file name, got {}", path, name, shard.dump()),
                  path);
    }
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
      throw Error(fmt::format("{}: weight_map entry '{}' names shard '{}', which is not a plain file name", path,
                              name, file),
                  path);
    }
    weight_map[name] = file;
  }
  if (weight_map.empty()) throw Error(fmt::format("{}: weight_map is empty", path), path);
  return weight_map;
}

namespace {

// Validates model.safetensors.index.json; returns tensor name -> shard file name.
std::map<std::string, std::string> read_index(const std::string& path) {
  return parse_safetensors_index(read_file_bytes(path), path);
}

// Length-prefixed field for the fingerprint, so concatenations cannot collide.
void hash_field(Sha256& h, std::string_view bytes) {
  const uint64_t n = bytes.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  h.update(len, 8);
  h.update(bytes);
}

}  // namespace

bool Checkpoint::has_weights(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/model.safetensors", ec) || fs::exists(dir + "/model.safetensors.index.json", ec);
}

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(fmt::format("checkpoint directory '{}' does not exist or is not a directory", dir), dir);
  }
  Checkpoint ck;
  ck.dir_ = dir;
  const std::string config_text = read_file_bytes(ck.config_path());
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    ck.shards_.push_back(SafeTensorsFile::open(single));
    for (const TensorInfo& info : ck.shards_[0]->tensors()) {
      ck.tensors_.emplace(info.name, TensorRef{&info, ck.shards_[0]->data(info), ck.shards_[0].get()});
    }
  } else if (fs::exists(index_path, ec)) {
    const std::map<std::string, std::string> weight_map = read_index(index_path);
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : weight_map) {
      if (shard_of_file.count(file)) continue;
      const std::string shard_path = dir + "/" + file;
      if (!fs::exists(shard_path, ec)) {
        throw Error(fmt::format("{}: shard '{}' (holding tensor '{}') is missing from {}", index_path, file, name, dir),
                    index_path);
      }
      shard_of_file[file] = ck.shards_.size();
      ck.shards_.push_back(SafeTensorsFile::open(shard_path));
    }
    for (const auto& [name, file] : weight_map) {
      const SafeTensorsFile& shard = *ck.shards_[shard_of_file[file]];
      const TensorInfo* info = shard.find(name);
      if (!info) {
        throw Error(fmt::format("{}: index maps tensor '{}' to shard '{}', but that shard has no such tensor",
                                index_path, name, file),
                    index_path);
      }
      ck.tensors_.emplace(name, TensorRef{info, shard.data(*info), &shard});
    }
  } else {
    throw Error(fmt::format("checkpoint directory '{}' has neither model.safetensors nor "
                            "model.safetensors.index.json (a config without weights, as models/shapes/: "
                            "--dummy-weights times random ones)",
                            dir),
                dir);
  }

  Sha256 h;
  hash_field(h, "kvq checkpoint fingerprint v1");
  hash_field(h, config_text);
  for (const auto& [name, ref] : ck.tensors_) {
    hash_field(h, name);
    hash_field(h, dtype_name(ref.info->dtype));
    std::string shape;
    for (int64_t d : ref.info->shape) shape += fmt::format("{},", d);
    hash_field(h, shape);
    const size_t sample = std::min<size_t>(256, ref.info->nbytes());
    hash_field(h, std::string_view(reinterpret_cast<const char*>(ref.data), sample));
  }
  ck.fingerprint_ = h.hex_digest();
  return ck;
}

bool Checkpoint::has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

TensorRef Checkpoint::get(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw Error(fmt::format("missing tensor '{}' in checkpoint {}", name, dir_), dir_);
  }
  return it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, ref] : tensors_) out.push_back(name);
  return out;
}

}  // namespace kvq
