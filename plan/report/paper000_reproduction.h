// Paper 000 (CloudMatrix384 serving): every published number the planner can predict, next to
// its prediction — Tables 2, 3, 4, 5 and 7, the buffer sizes of §4.2.1, and the ablations of
// §5.4 (microbatching, MTP, context caching) — plus the charts of the report.
#pragma once

#include "base/status.h"
#include "plan/report/paper_reproduction.h"

namespace peerserve::plan {

// Needs the profiles "ascend-910c", "h800" and "h100".
Result<PaperReproduction> reproduce_paper000(const HardwareSet& hardware);

}  // namespace peerserve::plan
