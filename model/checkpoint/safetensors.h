// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>"}}
// and then the data section; offsets are relative to the start of the data section, and the
// tensors must cover it exactly (no holes, no overlaps).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/checkpoint/mapped_file.h"
#include "tensor/dtype.h"

namespace peerserve {

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;                    // 8 + N: where the data section starts in the file
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
};

// Upper bound on N (the reference implementation's limit); larger headers are rejected.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Parses and validates the header of a complete safetensors file held in `file` (e.g. a
// mapping). Every failure is a DataLoss/InvalidArgument/Unimplemented Status whose message
// starts with `source` and names the tensor where one is involved: file shorter than 8 bytes,
// N larger than the file, bad JSON, wrong field types, unknown dtype, negative or overflowing
// shapes, offsets out of range, overlapping or not covering the data section, byte length not
// matching shape x dtype. Never reads outside `file`.
Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   const std::string& source);

// One mapped safetensors file with its parsed header. Immutable, so safe to share between
// threads.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return mapping_->path(); }
  const SafetensorsHeader& header() const { return header_; }
  // nullptr if the file has no tensor with this name.
  const SafetensorsTensorInfo* find(std::string_view name) const;
  // The tensor's bytes inside the mapping (REQUIRES: `info` comes from this file's header).
  std::span<const std::byte> tensor_bytes(const SafetensorsTensorInfo& info) const;
  const std::shared_ptr<const MappedFile>& mapping() const { return mapping_; }

 private:
  SafetensorsFile(std::shared_ptr<const MappedFile> mapping, SafetensorsHeader header);

  std::shared_ptr<const MappedFile> mapping_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

}  // namespace peerserve
