// Paper 004 §VI, Algorithm 2: decode expert placement guided by the prefill-stage routing of
// the same requests (Insight 1), for the first decode steps before EPLB has statistics.
//   Remap: keep E/G experts per rank; experts in decreasing Cost(f_e) go to the least-loaded
//     rank that still has room (greedy LPT with a cardinality limit).
//   Dup: keep the default contiguous layout and add R replica slots per rank; R·G times, copy
//     the (expert, rank) pair that most lowers the bottleneck rank load, splitting an expert's
//     tokens evenly over its copies.
// `load` holds the prefill frequencies f_{l,e}; `cost` is the paper's roofline Cost(f) (use
// linear_expert_time() for plain token counts).
#pragma once

#include "base/status.h"
#include "plan/placement/expert_layout.h"
#include "plan/placement/expert_routing_load.h"

namespace peerserve::plan {

// REQUIRES-as-error: num_experts % num_ranks == 0. Ties (equal cost, equal rank load) go to
// the lower expert id and the lower rank.
Result<ExpertLayout> remap_placement(const ExpertRoutingLoad& load, int num_ranks,
                                     const ExpertTimeFn& cost);

// REQUIRES-as-error: num_experts % num_ranks == 0, extra_slots_per_rank >= 0. The paper leaves
// ties in the bottleneck change open (they are common: copying an expert that is not on the
// bottleneck rank changes nothing); we take the smallest new maximum, then the smallest sum of
// squared rank loads (the most even result), then the lower expert id and rank.
Result<ExpertLayout> dup_placement(const ExpertRoutingLoad& load, int num_ranks,
                                   int extra_slots_per_rank, const ExpertTimeFn& cost);

}  // namespace peerserve::plan
