// One line of the reproduction report: a published number next to peerserve's prediction.
#pragma once

#include <string>

namespace peerserve::plan {

struct ReproductionRow {
  std::string source;      // e.g. "paper000 Table 4", "paper003 Table 2"
  std::string quantity;    // e.g. "decode throughput per NPU, batch 96 (tokens/s)"
  double published = 0.0;  // the value printed in the paper
  double predicted = 0.0;  // peerserve's value for the same setting
  std::string note;        // where the paper is inconsistent, or what was assumed
  // The row was used to fit a profile factor (so it is not an independent prediction), or is
  // the paper's own arithmetic recomputed; the report counts such rows separately.
  bool calibration = false;
  // The row is in the tables and sections the profile factors were fitted on jointly (paper
  // 000's Tables 3-5 and 7 and §5.4; plan/README.md "Calibration"): it shows how well one
  // set of factors per hardware fits them, and is not a held-out prediction.
  bool in_fit = false;

  double relative_error() const {
    return published == 0.0 ? 0.0 : (predicted - published) / published;
  }
};

}  // namespace peerserve::plan
