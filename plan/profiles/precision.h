// Numeric formats that weights, activations, KV cache and messages are stored or computed in.
#pragma once

#include <string_view>

#include "base/status.h"

namespace peerserve::plan {

enum class Precision { kFp4, kFp8, kInt8, kBf16, kFp16, kFp32 };

// Storage size of one element in bytes (0.5 for FP4).
double bytes_per_element(Precision precision);

// "fp4", "fp8", "int8", "bf16", "fp16", "fp32".
std::string_view precision_name(Precision precision);

// Accepts the names above (case-insensitive); anything else is an InvalidArgument naming the
// accepted values.
Result<Precision> parse_precision(std::string_view name);

}  // namespace peerserve::plan
