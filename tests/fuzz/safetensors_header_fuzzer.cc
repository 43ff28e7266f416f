// libFuzzer target: arbitrary bytes as a whole safetensors file. The parser must return an
// error or a header whose every tensor lies inside the file; ASan catches any read outside.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  peerserve::Result<peerserve::SafetensorsHeader> header =
      peerserve::parse_safetensors_header(file, "fuzz.safetensors");
  if (!header.ok()) return 0;
  uint64_t covered = 0;
  for (const peerserve::SafetensorsTensorInfo& t : header->tensors) {
    if (t.end < t.begin || header->data_offset + t.end > size) __builtin_trap();
    covered += t.end - t.begin;
    if (t.end > t.begin) {  // touch the first and last byte
      volatile std::byte first = file[header->data_offset + t.begin];
      volatile std::byte last = file[header->data_offset + t.end - 1];
      (void)first;
      (void)last;
    }
  }
  if (header->data_offset + covered != size) __builtin_trap();
  return 0;
}
