#include "model/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/json_nesting.h"

namespace peerserve {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxDim = uint64_t{1} << 48;
// A header is three levels deep (tensors, their fields, shape and offsets).
constexpr size_t kMaxHeaderJsonDepth = 16;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<SafetensorsTensorInfo> parse_entry(const std::string& name, const json& entry,
                                          const std::string& source) {
  const std::string where = source + ": tensor '" + name + "'";
  if (!entry.is_object()) return data_loss(where + ": header entry is not an object");
  SafetensorsTensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return data_loss(where + ": missing string field 'dtype'");
  }
  const std::string& dtype_text = dtype_it->get_ref<const std::string&>();
  const std::optional<DType> dtype = dtype_from_name(dtype_text);
  if (!dtype) {
    return unimplemented(where + ": dtype '" + dtype_text.substr(0, 32) +
                         "' is not supported (F32, BF16, F16, F8_E4M3, I8, I32, I64, U8)");
  }
  info.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return data_loss(where + ": missing array field 'shape'");
  }
  uint64_t numel = 1;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > kMaxDim) {
      return data_loss(where + ": shape " + shape_it->dump().substr(0, 80) +
                       " has an entry that is not a non-negative integer");
    }
    const uint64_t d = dim.get<uint64_t>();
    info.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && numel > kMaxDim / d) {
      return data_loss(where + ": shape " + shape_string(info.shape) + " overflows");
    }
    numel *= d;
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return data_loss(where + ": 'data_offsets' must be two non-negative integers [begin, end]");
  }
  info.begin = (*offsets_it)[0].get<uint64_t>();
  info.end = (*offsets_it)[1].get<uint64_t>();
  if (info.end < info.begin) {
    return data_loss(where + ": data_offsets [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + "] end before begin");
  }
  const uint64_t expected_bytes = numel * dtype_size(info.dtype);
  if (info.end - info.begin != expected_bytes) {
    return data_loss(where + ": data_offsets [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + "] span " + std::to_string(info.end - info.begin) +
                     " bytes, but shape " + shape_string(info.shape) + " x " +
                     std::string(dtype_name(info.dtype)) + " needs " +
                     std::to_string(expected_bytes));
  }
  return info;
}

}  // namespace

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   const std::string& source) {
  if (file.size() < 8) {
    return data_loss(source + ": file is " + std::to_string(file.size()) +
                     " bytes, too short for a safetensors header (needs at least 8)");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | std::to_integer<uint64_t>(file[static_cast<size_t>(i)]);
  }
  if (header_len > file.size() - 8) {
    return data_loss(source + ": header size " + std::to_string(header_len) +
                     " is larger than the file (" + std::to_string(file.size()) +
                     " bytes): truncated or not a safetensors file");
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return data_loss(source + ": header size " + std::to_string(header_len) +
                     " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes));
  }
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  json root = json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    std::string detail;
    try {
      [[maybe_unused]] const json reparsed = json::parse(text, text + header_len);
    } catch (const json::exception& e) {
      detail = std::string(": ") + e.what();
    }
    return data_loss(source + ": header is not valid JSON" + detail);
  }
  if (!root.is_object()) return data_loss(source + ": header is not a JSON object");
  // A header is three levels deep; its error messages dump() values, recursively.
  if (Status s = check_json_nesting(root, kMaxHeaderJsonDepth, source + ": header"); !s.ok()) {
    return data_loss(s.message());
  }

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return data_loss(source + ": '__metadata__' is not an object");
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          return data_loss(source + ": '__metadata__' value of '" + meta_key.substr(0, 64) +
                           "' is not a string");
        }
        header.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    PS_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, parse_entry(key, value, source));
    header.tensors.push_back(std::move(info));
  }

  // The tensors must tile the data section exactly: sorted by offset, each one starting where
  // the previous one ended, the last one ending at the end of the file.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  const uint64_t data_size = file.size() - header.data_offset;
  uint64_t expected_begin = 0;
  for (const SafetensorsTensorInfo& t : header.tensors) {
    if (t.end > data_size) {
      return data_loss(source + ": tensor '" + t.name + "' data_offsets [" +
                       std::to_string(t.begin) + ", " + std::to_string(t.end) +
                       "] out of range: the data section has " + std::to_string(data_size) +
                       " bytes (file truncated?)");
    }
    if (t.begin < expected_begin) {
      return data_loss(source + ": tensor '" + t.name + "' data_offsets [" +
                       std::to_string(t.begin) + ", " + std::to_string(t.end) +
                       "] overlap the previous tensor, which ends at " +
                       std::to_string(expected_begin));
    }
    if (t.begin > expected_begin) {
      return data_loss(source + ": data section has a hole: bytes [" +
                       std::to_string(expected_begin) + ", " + std::to_string(t.begin) +
                       ") before tensor '" + t.name + "' belong to no tensor");
    }
    expected_begin = t.end;
  }
  if (expected_begin != data_size) {
    return data_loss(source + ": data section has " + std::to_string(data_size) +
                     " bytes but the tensors cover only " + std::to_string(expected_begin));
  }
  return header;
}

SafetensorsFile::SafetensorsFile(std::shared_ptr<const MappedFile> mapping,
                                 SafetensorsHeader header)
    : mapping_(std::move(mapping)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapping, MappedFile::open(path));
  PS_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors_header(mapping->bytes(), path));
  return SafetensorsFile(std::move(mapping), std::move(header));
}

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::tensor_bytes(const SafetensorsTensorInfo& info) const {
  PS_CHECK(info.end <= mapping_->size() - header_.data_offset) << info.name;
  return mapping_->bytes().subspan(header_.data_offset + info.begin, info.end - info.begin);
}

}  // namespace peerserve
