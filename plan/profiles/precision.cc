#include "plan/profiles/precision.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace peerserve::plan {
namespace {

constexpr std::array<Precision, 6> kAll = {Precision::kFp4,  Precision::kFp8,  Precision::kInt8,
                                           Precision::kBf16, Precision::kFp16, Precision::kFp32};

}  // namespace

double bytes_per_element(Precision precision) {
  switch (precision) {
    case Precision::kFp4:
      return 0.5;
    case Precision::kFp8:
      return 1.0;
    case Precision::kInt8:
      return 1.0;
    case Precision::kBf16:
      return 2.0;
    case Precision::kFp16:
      return 2.0;
    case Precision::kFp32:
      return 4.0;
  }
  return 0.0;
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp4:
      return "fp4";
    case Precision::kFp8:
      return "fp8";
    case Precision::kInt8:
      return "int8";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      return "fp32";
  }
  return "?";
}

Result<Precision> parse_precision(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (Precision p : kAll) {
    if (lower == precision_name(p)) return p;
  }
  return invalid_argument("unknown precision '" + std::string(name) +
                          "', expected one of fp4, fp8, int8, bf16, fp16, fp32");
}

}  // namespace peerserve::plan
