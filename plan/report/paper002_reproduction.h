// Paper 002 (Insights into DeepSeek-V3): the decode-speed upper bound of §2.3.2 on 400 Gb/s
// InfiniBand and GB200 NVL72, the KV-cache sizes of Table 1, the parameter counts of §2.2
// and the training FLOPs per token of Table 2, and the MTP speed-up of §2.3.3.
#pragma once

#include "base/status.h"
#include "plan/report/paper_reproduction.h"

namespace peerserve::plan {

// Needs the profiles "h800" and "gb200".
Result<PaperReproduction> reproduce_paper002(const HardwareSet& hardware);

}  // namespace peerserve::plan
