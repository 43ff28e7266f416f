#include "plan/report/reproduction_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "plan/afd/afd_reproduction.h"
#include "plan/placement/placement_report.h"
#include "plan/report/paper000_reproduction.h"
#include "plan/report/paper002_reproduction.h"

namespace peerserve::plan {
namespace {

constexpr double kTolerance = 0.15;

std::string number(double value) {
  char buffer[64];
  const double magnitude = std::fabs(value);
  if (magnitude == 0.0) return "0";
  if (magnitude >= 1000.0) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", value);
  } else if (magnitude >= 10.0) {
    std::snprintf(buffer, sizeof(buffer), "%.1f", value);
  } else if (magnitude >= 0.1) {
    std::snprintf(buffer, sizeof(buffer), "%.3f", value);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.3g", value);
  }
  std::string out = buffer;
  // Group thousands for readability.
  const size_t dot = out.find('.');
  const size_t end = dot == std::string::npos ? out.size() : dot;
  const size_t start = out[0] == '-' ? 1 : 0;
  for (size_t i = end; i > start + 3; i -= 3) out.insert(i - 3, ",");
  return out;
}

std::string percent(double fraction) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%+.1f%%", fraction * 100.0);
  return buffer;
}

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// "paper000 Table 3" -> "paper000"
std::string paper_of(const std::string& source) {
  const size_t space = source.find(' ');
  return space == std::string::npos ? source : source.substr(0, space);
}

std::string section_of(const std::string& source) {
  const size_t space = source.find(' ');
  return space == std::string::npos ? std::string("-") : source.substr(space + 1);
}

NamedChart afd_ratio_chart(const AfdReproduction& afd) {
  LineChart throughput;
  throughput.title = "A/F ratio sweep (paper 003 baseline: B = 256, mu_P = 100, mu_D = 500)";
  throughput.x_axis.label = "Attention instances per FFN instance r";
  throughput.y_axis.label = "tokens per cycle per instance / idle fraction";
  ChartSeries theory = line_series("throughput, theory (eq. 6)");
  ChartSeries simulated = marker_series("throughput, simulated");
  ChartSeries idle_a = line_series("attention idle, theory");
  ChartSeries idle_f = line_series("FFN idle, theory");
  ChartSeries sim_idle_a = marker_series("attention idle, simulated");
  ChartSeries sim_idle_f = marker_series("FFN idle, simulated");
  idle_a.dashed = idle_f.dashed = true;
  idle_a.color = sim_idle_a.color = "#2ca02c";
  idle_f.color = sim_idle_f.color = "#9467bd";
  theory.color = simulated.color = "#1f77b4";
  for (const auto& point : afd.ratio_sweep) {
    theory.x.push_back(point.theory.ratio);
    theory.y.push_back(point.theory.throughput);
    idle_a.x.push_back(point.theory.ratio);
    idle_a.y.push_back(point.theory.attention_idle);
    idle_f.x.push_back(point.theory.ratio);
    idle_f.y.push_back(point.theory.ffn_idle);
    if (point.simulated) {
      simulated.x.push_back(point.theory.ratio);
      simulated.y.push_back(point.simulated->token_rate_per_instance);
      sim_idle_a.x.push_back(point.theory.ratio);
      sim_idle_a.y.push_back(point.simulated->attention_idle);
      sim_idle_f.x.push_back(point.theory.ratio);
      sim_idle_f.y.push_back(point.simulated->ffn_idle);
    }
  }
  throughput.series = {theory, simulated, idle_a, sim_idle_a, idle_f, sim_idle_f};
  throughput.x_markers.push_back(ChartMarker{9.30, "r* = 9.30", ""});
  return {"afd_ratio_sweep", "Attention/FFN ratio sweep: throughput and idle fractions",
          render_line_chart_svg(throughput)};
}

NamedChart accuracy_chart(const std::vector<ReproductionRow>& rows) {
  LineChart chart;
  chart.title = "Predicted vs published (every row with positive values)";
  chart.x_axis.label = "published";
  chart.y_axis.label = "predicted";
  chart.x_axis.log_scale = chart.y_axis.log_scale = true;
  std::map<std::string, ChartSeries> by_paper;
  double lo = 1e300;
  double hi = 0.0;
  for (const auto& row : rows) {
    if (!(row.published > 0.0) || !(row.predicted > 0.0)) continue;
    const std::string paper = paper_of(row.source);
    auto [it, inserted] = by_paper.try_emplace(paper, marker_series(paper));
    it->second.x.push_back(row.published);
    it->second.y.push_back(row.predicted);
    lo = std::min({lo, row.published, row.predicted});
    hi = std::max({hi, row.published, row.predicted});
  }
  if (hi > 0.0) {
    ChartSeries equal = line_series("predicted = published", {lo, hi}, {lo, hi});
    equal.color = "#333333";
    ChartSeries upper = line_series("+/-15%", {lo, hi}, {lo * 1.15, hi * 1.15});
    ChartSeries lower = line_series("", {lo, hi}, {lo * 0.85, hi * 0.85});
    upper.color = lower.color = "#999999";
    upper.dashed = lower.dashed = true;
    chart.series = {equal, upper, lower};
  }
  for (auto& [paper, series] : by_paper) chart.series.push_back(std::move(series));
  return {"predicted_vs_published", "Every row: predicted against published (log-log)",
          render_line_chart_svg(chart)};
}

// Paper 004 / EPLB: imbalance per MoE layer and per rank for each placement algorithm.
void add_placement(const PlacementReport& placement, ReproductionReport& report) {
  LineChart layers;
  layers.title = "Expert load imbalance per MoE layer (synthetic DeepSeek-V3 routing, EP32)";
  layers.x_axis.label = "MoE layer";
  layers.y_axis.label = "max / mean token-expert pairs per rank";
  LineChart ranks;
  ranks.title = "Load per rank, summed over layers";
  ranks.x_axis.label = "EP rank";
  ranks.y_axis.label = "token-expert pairs";
  std::ostringstream md;
  md << placement.scenario << "\n\n";
  md << "| placement | slots per rank | mean max/mean | worst max/mean | predicted MoE time "
        "speed-up |\n|---|---|---|---|---|\n";
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& entry : placement.entries) {
    ChartSeries per_layer = line_series(entry.algorithm);
    for (size_t i = 0; i < entry.max_over_mean.size() && i < placement.moe_layers.size(); ++i) {
      per_layer.x.push_back(placement.moe_layers[i]);
      per_layer.y.push_back(entry.max_over_mean[i]);
    }
    layers.series.push_back(std::move(per_layer));
    ChartSeries per_rank = line_series(entry.algorithm);
    for (size_t r = 0; r < entry.rank_load.size(); ++r) {
      per_rank.x.push_back(static_cast<double>(r));
      per_rank.y.push_back(entry.rank_load[r]);
    }
    ranks.series.push_back(std::move(per_rank));
    md << "| " << entry.algorithm << " | " << entry.slots_per_rank << " | "
       << number(entry.mean_max_over_mean) << " | " << number(entry.worst_max_over_mean) << " | "
       << number(entry.speedup) << " |\n";
    entries.push_back({{"algorithm", entry.algorithm},
                       {"slots_per_rank", entry.slots_per_rank},
                       {"mean_max_over_mean", entry.mean_max_over_mean},
                       {"worst_max_over_mean", entry.worst_max_over_mean},
                       {"speedup", entry.speedup}});
  }
  layers.y_markers.push_back(ChartMarker{1.0, "perfect balance", ""});
  report.charts.push_back({"placement_imbalance_per_layer",
                           "Expert placement: max/mean load per layer before and after",
                           render_line_chart_svg(layers)});
  report.charts.push_back(
      {"placement_rank_load", "Expert placement: load per rank", render_line_chart_svg(ranks)});
  report.placement_markdown = md.str();
  report.placement_json = {{"scenario", placement.scenario}, {"entries", entries}};
}

std::string hardware_table(const HardwareSet& hardware) {
  std::ostringstream md;
  md << "| profile | device | dense peak TFLOPS | HBM | scale-up | scale-out | efficiency "
        "(gemm / attention / memory / all-to-all / prefill) | fixed costs |\n";
  md << "|---|---|---|---|---|---|---|---|\n";
  for (const auto& [name, hw] : hardware) {
    std::string peaks;
    for (const auto& [precision, tflops] : hw.peak_tflops) {
      peaks += (peaks.empty() ? "" : ", ") + std::string(precision_name(precision)) + " " +
               number(tflops);
    }
    char eff[160];
    std::snprintf(eff, sizeof(eff), "%.3g / %.3g / %.3g / %.3g / %.3g", hw.efficiency.gemm,
                  hw.efficiency.attention, hw.efficiency.memory, hw.efficiency.all_to_all,
                  hw.efficiency.prefill);
    char fixed[200];
    std::snprintf(fixed, sizeof(fixed),
                  "all-to-all %.3g us + %.3g us/log2(ranks) + %.3g ns/copy; decode step %.3g ms",
                  hw.fixed.all_to_all_us, hw.fixed.all_to_all_per_log2_rank_us,
                  hw.fixed.all_to_all_per_token_copy_ns, hw.fixed.decode_step_ms);
    md << "| " << name << " | " << hw.device_kind
       << (hw.devices_per_package > 1
               ? " (" + std::to_string(hw.devices_per_package) + " per " + hw.package_kind + ")"
               : std::string())
       << " | " << peaks << " | " << number(hw.hbm_capacity_gb) << " GB, "
       << number(hw.hbm_bandwidth_gb_s) << " GB/s | " << hw.scale_up.name << " "
       << number(hw.scale_up.bandwidth_gb_s) << " GB/s x " << hw.scale_up_domain << " | "
       << hw.scale_out.name << " " << number(hw.scale_out.bandwidth_gb_s) << " GB/s | " << eff
       << " | " << fixed << " |\n";
  }
  return md.str();
}

std::string render_markdown(const ReproductionReport& report, const HardwareSet& hardware) {
  std::ostringstream md;
  md << "# peerserve reproduction report\n\n";
  md << "Generated by `peerserve plan reproduce`. *Published* is the number printed in the "
        "paper; *predicted* is peerserve's planner for the same setting, from the hardware "
        "profiles in `data/hardware/` (one profile per hardware: the same efficiency factors "
        "for every row on that hardware) and the deployments named in the notes. Error = "
        "(predicted - published) / published. Rows marked *calibration* fixed a value or "
        "restate the paper's own arithmetic. Rows marked *fit* are in the tables the "
        "efficiency factors were fitted on jointly (paper 000's Tables 3-5 and 7 and §5.4): "
        "they show how well one set of factors per hardware fits them, not predictions. "
        "Only the other rows are predictions.\n\n";

  const ErrorSummary all = summarize_errors(report.rows, kTolerance);
  md << "## Summary\n\n";
  md << "- " << all.rows << " rows: " << all.calibration << " calibration, " << all.fitted
     << " in the fit, " << all.predictions << " held-out predictions.\n";
  md << "- Predictions: " << all.within_tolerance << " of " << all.predictions << " ("
     << number(100.0 * all.within_tolerance / std::max(1, all.predictions))
     << "%) within 15%; median absolute error " << percent(all.median_abs_error) << ", largest "
     << percent(all.max_abs_error) << ".\n";
  md << "- Fit: " << all.fit_within_tolerance << " of " << all.fitted
     << " fitted rows within 15%.\n\n";
  md << "| source | rows | in the fit (within 15%) | predictions | within 15% | median abs. error "
        "| largest abs. error |\n";
  md << "|---|---|---|---|---|---|---|\n";
  std::map<std::string, std::vector<ReproductionRow>> by_paper;
  for (const auto& row : report.rows) by_paper[paper_of(row.source)].push_back(row);
  for (const auto& [paper, rows] : by_paper) {
    const ErrorSummary s = summarize_errors(rows, kTolerance);
    md << "| " << paper << " | " << s.rows << " | " << s.fitted << " (" << s.fit_within_tolerance
       << ") | " << s.predictions << " | " << s.within_tolerance << " | "
       << (s.predictions > 0 ? percent(s.median_abs_error) : "-") << " | "
       << (s.predictions > 0 ? percent(s.max_abs_error) : "-") << " |\n";
  }
  md << "\n## Hardware profiles\n\n" << hardware_table(hardware) << "\n";

  md << "## Rows\n\n";
  for (const auto& [paper, rows] : by_paper) {
    md << "### " << paper << "\n\n";
    md << "| section | quantity | published | predicted | error | note |\n";
    md << "|---|---|---|---|---|---|\n";
    for (const auto& row : rows) {
      const double error = row.relative_error();
      std::string flag = std::fabs(error) <= kTolerance ? "" : " **";
      md << "| " << escape_cell(section_of(row.source)) << " | " << escape_cell(row.quantity)
         << " | " << number(row.published) << " | " << number(row.predicted) << " | " << flag
         << percent(error) << (flag.empty() ? "" : "**") << " | "
         << (row.calibration ? "*calibration* "
             : row.in_fit    ? "*fit* "
                             : "")
         << escape_cell(row.note) << " |\n";
    }
    md << "\n";
  }

  if (!report.placement_markdown.empty()) {
    md << "## Expert placement (paper 004 and EPLB): an illustration\n\n"
       << report.placement_markdown << "\n";
  }
  md << "## Where the papers disagree with themselves\n\n";
  for (const auto& line : report.inconsistencies) md << "- " << line << "\n";
  md << "\n## Charts\n\n";
  for (const auto& chart : report.charts) {
    md << "### " << chart.caption << "\n\n![" << chart.caption << "](" << chart.file_stem
       << ".svg)\n\n";
  }
  return md.str();
}

nlohmann::json render_json(const ReproductionReport& report, const HardwareSet& hardware) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : report.rows) {
    rows.push_back({{"source", row.source},
                    {"quantity", row.quantity},
                    {"published", row.published},
                    {"predicted", row.predicted},
                    {"relative_error", row.relative_error()},
                    {"note", row.note},
                    {"calibration", row.calibration},
                    {"in_fit", row.in_fit}});
  }
  const ErrorSummary s = summarize_errors(report.rows, kTolerance);
  nlohmann::json profiles = nlohmann::json::object();
  for (const auto& [name, hw] : hardware) profiles[name] = hardware_profile_to_json(hw);
  nlohmann::json charts = nlohmann::json::array();
  for (const auto& chart : report.charts) {
    charts.push_back({{"file", chart.file_stem + ".svg"}, {"caption", chart.caption}});
  }
  return {{"rows", rows},
          {"summary",
           {{"rows", s.rows},
            {"calibration", s.calibration},
            {"in_fit", s.fitted},
            {"in_fit_within_15_percent", s.fit_within_tolerance},
            {"predictions", s.predictions},
            {"within_15_percent", s.within_tolerance},
            {"median_abs_error", s.median_abs_error},
            {"max_abs_error", s.max_abs_error}}},
          {"inconsistencies", report.inconsistencies},
          {"placement", report.placement_json},
          {"hardware", profiles},
          {"charts", charts}};
}

// The sections the profile factors were fitted on (plan/README.md, "Calibration").
bool in_profile_fit(const std::string& source) {
  for (const char* fitted :
       {"paper000 Table 3", "paper000 Table 4", "paper000 Table 5", "paper000 Table 7"}) {
    if (source == fitted) return true;
  }
  return source.rfind("paper000 §5.4", 0) == 0;
}

}  // namespace

ErrorSummary summarize_errors(const std::vector<ReproductionRow>& rows, double tolerance) {
  ErrorSummary s;
  std::vector<double> errors;
  for (const auto& row : rows) {
    ++s.rows;
    if (row.calibration) {
      ++s.calibration;
      continue;
    }
    const double e = std::fabs(row.relative_error());
    if (row.in_fit) {
      ++s.fitted;
      if (e <= tolerance) ++s.fit_within_tolerance;
      continue;
    }
    ++s.predictions;
    errors.push_back(e);
    if (e <= tolerance) ++s.within_tolerance;
  }
  if (!errors.empty()) {
    std::sort(errors.begin(), errors.end());
    const size_t n = errors.size();
    s.median_abs_error = n % 2 ? errors[n / 2] : 0.5 * (errors[n / 2 - 1] + errors[n / 2]);
    s.max_abs_error = errors.back();
  }
  return s;
}

Result<ReproductionReport> build_reproduction_report(const HardwareSet& hardware,
                                                     const ReproductionOptions& options) {
  ReproductionReport report;
  auto append = [&report](PaperReproduction paper) {
    for (auto& row : paper.rows) report.rows.push_back(std::move(row));
    for (auto& chart : paper.charts) report.charts.push_back(std::move(chart));
    for (auto& line : paper.inconsistencies) report.inconsistencies.push_back(std::move(line));
  };
  PS_ASSIGN_OR_RETURN(PaperReproduction p000, reproduce_paper000(hardware));
  for (ReproductionRow& row : p000.rows) row.in_fit = in_profile_fit(row.source);
  append(std::move(p000));
  PS_ASSIGN_OR_RETURN(PaperReproduction p002, reproduce_paper002(hardware));
  append(std::move(p002));

  // Paper 003 (plan/afd): its rows and the A/F ratio sweep.
  AfdReproductionOptions afd_options;
  afd_options.simulated_requests_per_instance = options.afd_simulated_requests_per_instance;
  PS_ASSIGN_OR_RETURN(AfdReproduction afd, afd_reproduction(afd_options));
  // Its rows flag the paper's own inconsistencies in their notes; list each once (a note
  // that extends an earlier one replaces it).
  std::vector<std::string> flagged;
  for (const auto& row : afd.rows) {
    const std::string tag = "[INCONSISTENT]";
    const size_t at = row.note.find(tag);
    if (at == std::string::npos) continue;
    std::string text = row.note.substr(at + tag.size());
    text.erase(0, text.find_first_not_of(' '));
    bool merged = false;
    for (auto& earlier : flagged) {
      if (text.rfind(earlier, 0) == 0) earlier = text;
      merged = merged || earlier.rfind(text, 0) == 0;
    }
    if (!merged) flagged.push_back(text);
  }
  for (const auto& text : flagged) report.inconsistencies.push_back("paper003: " + text);
  for (auto& row : afd.rows) report.rows.push_back(std::move(row));
  report.charts.push_back(afd_ratio_chart(afd));

  // Paper 004 (plan/placement): no printed per-layer numbers to compare with, so an
  // illustration (table and charts) rather than rows.
  if (options.include_placement) {
    PS_ASSIGN_OR_RETURN(PlacementReport placement, placement_report());
    add_placement(placement, report);
  }

  report.charts.push_back(accuracy_chart(report.rows));
  report.markdown = render_markdown(report, hardware);
  report.json = render_json(report, hardware);
  return report;
}

}  // namespace peerserve::plan
