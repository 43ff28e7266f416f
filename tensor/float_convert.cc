#include "tensor/float_convert.h"

#include <algorithm>

namespace peerserve {

uint8_t float_to_f8e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7f;  // the NaN keeps its sign, as torch's does
  const float a = std::min(std::fabs(f), 448.0f);
  // Subnormals (and the smallest normal) are multiples of 2^-9: codes 0..8 continue
  // seamlessly into the normal range, so rounding a/2^-9 gives the code directly.
  if (a < 0x1p-6f) {
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e = 0;
  const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  int exponent = e - 1;                  // a = (1 + m/8) * 2^exponent
  int mant = static_cast<int>(std::nearbyint((frac * 2.0f - 1.0f) * 8.0f));  // ties to even
  if (mant == 8) {
    mant = 0;
    ++exponent;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | mant);
}

}  // namespace peerserve
