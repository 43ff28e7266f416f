#include "model/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "model/checkpoint/safetensors_writer.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve {
namespace {

using testing::ScratchDir;

// A safetensors file assembled by hand (independently of the writer): 8-byte little-endian
// header length, the JSON text, the data.
std::string make_file(const std::string& json_header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json_header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + json_header + data;
}

Result<SafetensorsHeader> parse(const std::string& file) {
  return parse_safetensors_header({reinterpret_cast<const std::byte*>(file.data()), file.size()},
                                  "shard.safetensors");
}

// Expects a failure whose message names the file and contains `fragment`.
void expect_error(const std::string& file, const std::string& fragment) {
  Result<SafetensorsHeader> r = parse(file);
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(r.status().message().rfind("shard.safetensors: ", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(SafetensorsTest, ParsesHandWrittenFile) {
  // a: F32 [2] = {1.5, -2}; b: BF16 [1, 3]; stored b first to check offset sorting.
  std::string data(6, '\0');
  const uint16_t b_bits[3] = {0x3f80, 0x4000, 0xc040};  // 1, 2, -3 in bfloat16
  std::memcpy(data.data(), b_bits, 6);
  const float a_values[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(a_values), 8);
  const std::string file = make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[6,14]},)"
                                     R"("__metadata__":{"format":"pt"},)"
                                     R"("b":{"dtype":"BF16","shape":[1,3],"data_offsets":[0,6]}})",
                                     data);
  Result<SafetensorsHeader> r = parse(file);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "b");
  EXPECT_EQ(r->tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(r->tensors[0].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r->tensors[1].name, "a");
  EXPECT_EQ(r->tensors[1].begin, 6u);
  EXPECT_EQ(r->metadata.at("format"), "pt");
  EXPECT_EQ(r->data_offset, file.size() - 14);
}

TEST(SafetensorsTest, EmptyFileWithNoTensorsIsValid) {
  EXPECT_TRUE(parse(make_file("{}", "")).ok());
  EXPECT_TRUE(parse(make_file("{}    ", "")).ok());  // header padded with spaces
}

TEST(SafetensorsTest, ScalarAndZeroSizedTensors) {
  Result<SafetensorsHeader> r =
      parse(make_file(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                      R"("z":{"dtype":"F32","shape":[0,4],"data_offsets":[8,8]}})",
                      std::string(8, '\1')));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors.size(), 2u);
}

TEST(SafetensorsTest, RejectsShortFile) {
  expect_error("", "too short");
  expect_error(std::string(7, '\0'), "too short");
}

TEST(SafetensorsTest, RejectsHeaderLargerThanFile) {
  std::string file =
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  file[0] = static_cast<char>(0xff);
  file[5] = 0x10;
  expect_error(file, "larger than the file");
  // Truncated inside the header.
  expect_error(file.substr(0, 20), "larger than the file");
}

TEST(SafetensorsTest, RejectsBadJson) {
  expect_error(make_file(R"({"a":{"dtype":"F32",)", ""), "not valid JSON");
  expect_error(make_file("[1,2,3]", ""), "not a JSON object");
  expect_error(make_file(std::string("{\"a\\xff\":1}"), ""), "");  // any error is fine
}

// A header nested a million levels deep (2 MB, far under the header limit): refused by its
// depth before any error message prints a value of it (dump() recursed once per level and
// overflowed the stack).
TEST(SafetensorsTest, RejectsDeeplyNestedHeaders) {
  const size_t levels = 1000000;
  const std::string deep = std::string(levels, '[') + std::string(levels, ']');
  expect_error(
      make_file(R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", ""),
      "nested deeper than 16 levels");
}

TEST(SafetensorsTest, RejectsMalformedEntries) {
  expect_error(make_file(R"({"a":5})", ""), "tensor 'a': header entry is not an object");
  expect_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)),
               "tensor 'a': missing string field 'dtype'");
  expect_error(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, 0)),
               "tensor 'a': missing array field 'shape'");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, 0)),
      "not a non-negative integer");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", std::string(4, 0)),
      "not a non-negative integer");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, 0)),
      "'data_offsets' must be two non-negative integers");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, 0)),
      "end before begin");
  expect_error(make_file(R"({"__metadata__":{"k":1}})", ""), "'__metadata__' value of 'k'");
  expect_error(make_file(R"({"__metadata__":[]})", ""), "'__metadata__' is not an object");
}

TEST(SafetensorsTest, RejectsUnknownDtype) {
  Result<SafetensorsHeader> r = parse(
      make_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, 0)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("tensor 'a': dtype 'F64' is not supported"),
            std::string::npos)
      << r.status().message();
}

TEST(SafetensorsTest, RejectsByteLengthNotMatchingShape) {
  expect_error(
      make_file(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", std::string(4, 0)),
      "needs 6");
}

TEST(SafetensorsTest, RejectsShapeOverflow) {
  expect_error(
      make_file(
          R"({"a":{"dtype":"F32","shape":[281474976710656,281474976710656],"data_offsets":[0,4]}})",
          std::string(4, 0)),
      "overflows");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[18446744073709551615],)"
                         R"("data_offsets":[0,4]}})",
                         std::string(4, 0)),
               "not a non-negative integer");
}

TEST(SafetensorsTest, RejectsOffsetsOutOfRange) {
  // Truncated data section: the tensor claims 8 bytes, the file has 4.
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, 0)),
      "out of range");
  expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],)"
                         R"("data_offsets":[18446744073709551615,18446744073709551616]}})",
                         std::string(4, 0)),
               "");
}

TEST(SafetensorsTest, RejectsOverlapHoleAndUncoveredTail) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(8, 0)),
               "overlap");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 0)),
      "hole");
  expect_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, 0)),
      "cover only 4");
}

// Writer -> file -> reader for every dtype, with the bytes compared exactly.
TEST(SafetensorsTest, WriterRoundTripAllDtypes) {
  ScratchDir dir;
  std::vector<TensorToWrite> tensors;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3,
                          DType::kI8,  DType::kI32,  DType::kI64, DType::kU8};
  int k = 0;
  for (DType dtype : dtypes) {
    TensorToWrite t{"t." + std::string(dtype_name(dtype)), dtype, {3, 5}, {}};
    t.bytes.resize(15 * dtype_size(dtype));
    for (std::byte& b : t.bytes) b = static_cast<std::byte>(k++ * 37 + 11);
    tensors.push_back(std::move(t));
  }
  const std::string path = dir.file("x.safetensors");
  ASSERT_TRUE(write_safetensors_file(path, tensors, {{"format", "pt"}}).ok());
  const std::string raw = testing::read_file_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);  // data section 8-byte aligned

  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
  for (const TensorToWrite& t : tensors) {
    const SafetensorsTensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    const std::span<const std::byte> bytes = f->tensor_bytes(*info);
    ASSERT_EQ(bytes.size(), t.bytes.size());
    EXPECT_EQ(std::memcmp(bytes.data(), t.bytes.data(), bytes.size()), 0) << t.name;
  }
  EXPECT_EQ(f->find("missing"), nullptr);
}

TEST(SafetensorsTest, OpenReportsMissingAndTruncatedFiles) {
  ScratchDir dir;
  Result<SafetensorsFile> missing = SafetensorsFile::open(dir.file("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);

  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(
      write_safetensors_file(path, {{"w", DType::kBF16, {4, 4}, std::vector<std::byte>(32)}}).ok());
  const std::string full = testing::read_file_bytes(path);
  testing::write_file_bytes(path, full.substr(0, full.size() - 1));
  Result<SafetensorsFile> truncated = SafetensorsFile::open(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find(path + ": tensor 'w'"), std::string::npos)
      << truncated.status().message();
}

}  // namespace
}  // namespace peerserve
