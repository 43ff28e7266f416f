// Element types that peerserve stores or reads from checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace peerserve {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kI32, kI64, kU8 };

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "I8", "I32", "I64", "U8".
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace peerserve
