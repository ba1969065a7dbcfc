// Safetensors reader and writer: round trips of every dtype, header validation from memory, and the committed
// corpus of malformed files and checkpoint directories (tests/malformed/EXPECTED.tsv), each of which must raise a
// kvq::Error naming the problem.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/half.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("kvq_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

OwnedTensor raw_tensor(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  OwnedTensor t{std::move(name), dtype, std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(size_t(n) * dtype_size(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = uint8_t(seed + i * 37);
  return t;
}

// Message of the kvq::Error fn throws, or a failure when it throws nothing.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kvq::Error";
  return {};
}

SafeTensorsHeader parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors_header(bytes.data(), bytes.size(), "mem");
}

std::vector<uint8_t> file_from_header(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> out(8 + json.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(json.size()) >> (8 * i));
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

}  // namespace

TEST(SafeTensors, DTypeNamesAndSizes) {
  const std::pair<const char*, size_t> want[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                 {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [name, size] : want) {
    const DType dt = parse_dtype(name, "test");
    EXPECT_EQ(dtype_name(dt), name);
    EXPECT_EQ(dtype_size(dt), size) << name;
  }
  EXPECT_NE(error_of([] { parse_dtype("F8_E5M2", "x"); }).find("unknown dtype 'F8_E5M2' (supported: F64, F32"),
            std::string::npos);
}

TEST(SafeTensors, WriterReaderRoundTripOfEveryDTypeKeepsBytesShapesAndMetadata) {
  const std::string dir = temp_dir("roundtrip");
  std::vector<OwnedTensor> tensors = {
      raw_tensor("u8", DType::U8, {3}, 1),          raw_tensor("f64", DType::F64, {2, 3}, 2),
      raw_tensor("bf16", DType::BF16, {5}, 3),      raw_tensor("f32", DType::F32, {1, 2, 3}, 4),
      raw_tensor("f16", DType::F16, {7}, 5),        raw_tensor("i64", DType::I64, {2}, 6),
      raw_tensor("i32", DType::I32, {3, 1}, 7),     raw_tensor("i16", DType::I16, {9}, 8),
      raw_tensor("i8", DType::I8, {4}, 9),          raw_tensor("bool", DType::BOOL, {2, 2}, 10),
      raw_tensor("scalar", DType::F32, {}, 11),     raw_tensor("empty", DType::F32, {0, 4}, 12)};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"kvq", "rotation v1"}};
  const std::string path = dir + "/all.safetensors";
  write_safetensors(path, tensors, meta);

  const auto f = SafeTensorsFile::open(path);
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->header().data_start % 8, 0u);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const OwnedTensor& t : tensors) {
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    ASSERT_EQ(info->nbytes(), t.bytes.size()) << t.name;
    EXPECT_EQ(info->begin % dtype_size(t.dtype), 0u) << t.name << " is not aligned to its element size";
    EXPECT_EQ(std::memcmp(f->data(*info), t.bytes.data(), t.bytes.size()), 0) << t.name;
  }
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_NE(error_of([&] { f->at("missing"); }).find("all.safetensors: no tensor named 'missing'"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SafeTensors, FloatDTypesConvertToF32WithRoundToNearestEven) {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159265f, 1e-3f, 65504.0f, -2.5e-8f};
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::vector<uint8_t> file = serialize_safetensors({OwnedTensor::from_f32("x", dt, {2, 3}, values)}, {});
    const SafeTensorsHeader h = parse(file);
    const TensorRef ref{&h.tensors[0], file.data() + h.data_start + h.tensors[0].begin};
    const std::vector<float> got = to_f32(ref);
    ASSERT_EQ(got.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = dt == DType::F32 ? values[i]
                         : dt == DType::F16 ? fp16_to_f32(f32_to_fp16(values[i]))
                                            : bf16_to_f32(f32_to_bf16(values[i]));
      EXPECT_EQ(got[i], want) << dtype_name(dt) << " element " << i;
    }
    // A sub-range lands at the right place.
    float two[2];
    to_f32(ref, 2, 2, two);
    EXPECT_EQ(two[0], got[2]);
    EXPECT_EQ(two[1], got[3]);
  }
  const std::vector<uint8_t> file = serialize_safetensors({raw_tensor("ids", DType::I64, {2}, 0)}, {});
  const SafeTensorsHeader h = parse(file);
  EXPECT_NE(error_of([&] { to_f32(TensorRef{&h.tensors[0], file.data() + h.data_start}); })
                .find("tensor 'ids' has dtype I64; only F32, F16 and BF16"),
            std::string::npos);
}

TEST(SafeTensors, WriterLaysOutLargestElementsFirstWithoutGaps) {
  const std::vector<uint8_t> file = serialize_safetensors(
      {raw_tensor("a_u8", DType::U8, {3}, 0), raw_tensor("b_f32", DType::F32, {3}, 0),
       raw_tensor("c_bf16", DType::BF16, {1}, 0)},
      {});
  const SafeTensorsHeader h = parse(file);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "b_f32");
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[1].name, "c_bf16");
  EXPECT_EQ(h.tensors[1].begin, 12u);
  EXPECT_EQ(h.tensors[2].name, "a_u8");
  EXPECT_EQ(h.tensors[2].begin, 14u);
  EXPECT_EQ(h.data_start + 17, file.size());
  EXPECT_TRUE(h.metadata.empty());
}

TEST(SafeTensors, WriterRejectsDuplicateNamesAndByteCountMismatch) {
  EXPECT_NE(error_of([] {
              serialize_safetensors({raw_tensor("a", DType::U8, {1}, 0), raw_tensor("a", DType::U8, {1}, 0)}, {});
            }).find("duplicate tensor name 'a'"),
            std::string::npos);
  OwnedTensor bad = raw_tensor("w", DType::F32, {2}, 0);
  bad.bytes.pop_back();
  EXPECT_NE(error_of([&] { serialize_safetensors({bad}, {}); }).find("tensor 'w': shape needs 8 bytes of F32 but 7"),
            std::string::npos);
}

TEST(SafeTensors, HeaderParserAcceptsPaddingZeroSizedTensorsAndAdjacentRanges) {
  const SafeTensorsHeader h = parse(file_from_header(
      R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},)"
      R"( "z": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},)"
      R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"k": "v"}}      )",
      16));
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[2].name, "b");
  EXPECT_EQ(h.metadata.at("k"), "v");
}

TEST(SafeTensors, HeaderParserErrorsNameTheInputAndTheTensor) {
  const std::string msg = error_of([] {
    parse_safetensors_header(nullptr, 0, "some/file.safetensors");
  });
  EXPECT_NE(msg.find("some/file.safetensors: file is truncated: 0 bytes"), std::string::npos) << msg;
  const std::string msg2 = error_of([] {
    parse(file_from_header(R"({"w.bias": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8));
  });
  EXPECT_NE(msg2.find("mem: tensor 'w.bias': shape [3] of F32 needs 12 bytes"), std::string::npos) << msg2;
}

TEST(SafeTensors, EveryTruncationOfAValidFileIsRejectedCleanly) {
  const std::vector<uint8_t> file = serialize_safetensors(
      {OwnedTensor::from_f32("x", DType::F32, {4}, {1, 2, 3, 4}), raw_tensor("y", DType::U8, {5}, 1)}, {{"a", "b"}});
  EXPECT_EQ(parse(file).tensors.size(), 2u);
  for (size_t n = 0; n < file.size(); ++n) {
    const std::vector<uint8_t> cut(file.begin(), file.begin() + long(n));
    EXPECT_THROW(parse(cut), Error) << "truncated to " << n << " bytes";
  }
}

TEST(SafeTensors, MalformedCorpusGivesTheExpectedErrors) {
  const std::string root = std::string(KVQ_SOURCE_DIR) + "/tests/malformed";
  std::ifstream manifest(root + "/EXPECTED.tsv");
  ASSERT_TRUE(manifest) << "missing " << root << "/EXPECTED.tsv";
  std::set<std::string> listed;
  std::string line;
  int cases = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    std::string rel, kind, expect;
    std::getline(row, rel, '\t');
    std::getline(row, kind, '\t');
    std::getline(row, expect);
    const std::string path = root + "/" + rel;
    if (const size_t at = expect.find("{dir}"); at != std::string::npos) expect.replace(at, 5, path);
    listed.insert(rel);
    SCOPED_TRACE(rel);
    const std::string msg = error_of([&] {
      if (kind == "header") {
        SafeTensorsFile::open(path);
      } else if (kind == "checkpoint") {
        Checkpoint::open(path);
      } else if (kind == "weights") {
        const Checkpoint ck = Checkpoint::open(path);
        Weights::load(ck, ModelConfig::load(ck.config_path()), 2);
      } else if (kind == "config") {
        ModelConfig::load(path);
      } else {
        FAIL() << "unknown kind " << kind;
      }
    });
    EXPECT_NE(msg.find(expect), std::string::npos) << "message: " << msg << "\nexpected to contain: " << expect;
    ++cases;
  }
  EXPECT_GE(cases, 40);
  for (const auto& entry : fs::directory_iterator(root)) {  // every corpus file has an expectation
    const std::string name = entry.path().filename().string();
    if (name == "EXPECTED.tsv" || name == "make_malformed.py") continue;
    EXPECT_TRUE(listed.count(name)) << name << " is not listed in EXPECTED.tsv";
  }
}
