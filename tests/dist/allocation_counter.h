// Counts heap allocations (operator new, every form) per thread in a test binary that links
// allocation_counter.cc, which replaces the global allocation functions.
#pragma once

#include <cstdint>

namespace peerserve::dist::testing {

// Allocations made so far by the calling thread.
int64_t allocations_on_this_thread();

}  // namespace peerserve::dist::testing
