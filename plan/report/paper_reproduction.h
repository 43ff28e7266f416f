// Shared pieces of the per-paper reproduction code: the hardware profiles it runs on, the
// result of one paper (rows, charts, inconsistencies found in the paper itself), and the
// workload assumptions every row shares.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/profiles/hardware_profile.h"
#include "plan/report/reproduction_row.h"
#include "plan/report/svg_chart.h"

namespace peerserve::plan {

// Profiles by name ("ascend-910c", "h800", "h100", "gb200", ...).
using HardwareSet = std::map<std::string, HardwareProfile>;
Result<const HardwareProfile*> find_hardware(const HardwareSet& hardware, const std::string& name);

struct PaperReproduction {
  std::vector<ReproductionRow> rows;
  std::vector<NamedChart> charts;
  // Places where the paper's own numbers disagree with each other, in one sentence each.
  std::vector<std::string> inconsistencies;
};

// Max over mean routed tokens per EP rank under the papers' production ("default") expert
// load balancing, as opposed to their "perfect EPLB" runs. One value for every system: paper
// 000 Table 3 shows the same default/perfect throughput ratio (1.18) for SGLang on H100 and
// CloudMatrix; the value is fitted on the CloudMatrix pair and the SGLang pair is predicted.
inline constexpr double kDefaultEplbImbalance = 1.4;

}  // namespace peerserve::plan
