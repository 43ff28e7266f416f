// The whole reproduction report: every paper's rows and charts, a summary of the relative
// errors, the papers' own inconsistencies, as Markdown and as JSON (one record per row). The
// caller (apps/) writes report.md, report.json and <chart>.svg into a folder.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "plan/report/paper_reproduction.h"

namespace peerserve::plan {

struct ReproductionReport {
  std::vector<ReproductionRow> rows;
  std::vector<NamedChart> charts;
  std::vector<std::string> inconsistencies;
  std::string placement_markdown;  // paper 004: an illustration, no printed numbers
  nlohmann::json placement_json;
  std::string markdown;
  nlohmann::json json;
};

struct ReproductionOptions {
  // Paper 003's simulated rows and sweep use this N per Attention instance (the paper's is
  // 10,000); tests pass less to stay fast under sanitizers.
  double afd_simulated_requests_per_instance = 10000;
  bool include_placement = true;
};

// Rows within `tolerance` relative error, counted over the rows that are predictions
// (calibration rows excluded).
// Rows are counted in three kinds: calibration (a value was fixed on them), in the fit (the
// tables the factors were fitted on: how well they fit), and held-out predictions. The error
// statistics are of the predictions; fit_within_tolerance counts the fitted rows that fit.
struct ErrorSummary {
  int rows = 0;
  int calibration = 0;
  int fitted = 0;
  int fit_within_tolerance = 0;
  int predictions = 0;
  int within_tolerance = 0;
  double median_abs_error = 0.0;
  double max_abs_error = 0.0;
};
ErrorSummary summarize_errors(const std::vector<ReproductionRow>& rows, double tolerance);

// Papers 000 and 002 (this folder), 003 (plan/afd) and 004 (plan/placement). Needs the
// hardware profiles "ascend-910c", "h800", "h100" and "gb200".
Result<ReproductionReport> build_reproduction_report(const HardwareSet& hardware,
                                                     const ReproductionOptions& options = {});

}  // namespace peerserve::plan
