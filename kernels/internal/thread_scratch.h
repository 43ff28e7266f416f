// Per-thread scratch for the x86 kernel files, defined in a file built without ISA flags:
// a std::vector used inside a wide-ISA file would have its inline members (resize, the
// allocator) emitted there, and the linker may keep that copy for the whole program
// (internal/kernel_table.h).
#pragma once

#include <cstddef>

namespace peerserve::kernels::internal {

// At least `count` floats, valid on this thread until its next call; the contents are not
// kept across calls of different sizes.
float* thread_scratch_floats(size_t count);

}  // namespace peerserve::kernels::internal
