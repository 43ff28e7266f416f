// Small self-contained SVG charts for the planner's reports (no plotting library needed):
// line/scatter charts with optional log axes and marker lines, and grouped bar charts.
//
//   LineChart chart;
//   chart.title = "Decode throughput vs batch (TPOT SLO 50 ms)";
//   chart.x_axis.label = "batch per die";
//   chart.y_axis.label = "tokens/s per NPU";
//   chart.series.push_back(line_series("predicted", xs, ys));
//   chart.series.push_back(marker_series("paper Table 5", px, py));
//   chart.x_markers.push_back(ChartMarker{9.3, "r* theory", ""});
//   std::string svg = render_line_chart_svg(chart);
//
// Rendering never fails: empty or non-finite data gives an empty plot area with the title, and
// non-positive values on a log axis are skipped.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace peerserve::plan {

enum class SeriesStyle { kLine, kMarkers, kLineAndMarkers };

struct ChartSeries {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;  // same length as x; extra points of the longer one are ignored
  SeriesStyle style = SeriesStyle::kLine;
  std::string color;  // "#rrggbb"; empty picks the next colour of a fixed palette
  bool dashed = false;
};

struct ChartAxis {
  std::string label;
  bool log_scale = false;
  std::optional<double> min;  // default: from the data (0 included for linear y axes)
  std::optional<double> max;
};

ChartSeries line_series(std::string label, std::vector<double> x = {}, std::vector<double> y = {});
ChartSeries marker_series(std::string label, std::vector<double> x = {},
                          std::vector<double> y = {});

// A vertical (x_markers) or horizontal (y_markers) reference line with a short label.
struct ChartMarker {
  double value = 0.0;
  std::string label;
  std::string color;  // empty: grey
};

struct LineChart {
  std::string title;
  ChartAxis x_axis;
  ChartAxis y_axis;
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> x_markers;
  std::vector<ChartMarker> y_markers;
  int width = 760;
  int height = 460;
};

std::string render_line_chart_svg(const LineChart& chart);

// Grouped bars: one group per category, one bar per series within each group.
struct BarChart {
  std::string title;
  std::string y_label;
  std::vector<std::string> series_labels;
  std::vector<std::string> categories;
  std::vector<std::vector<double>> values;  // values[series][category]
  int width = 760;
  int height = 460;
};

std::string render_bar_chart_svg(const BarChart& chart);

// A chart ready to be written into a report folder as <file_stem>.svg and linked from the
// Markdown with `caption`.
struct NamedChart {
  std::string file_stem;  // e.g. "afd_ratio_sweep"; [a-z0-9_-] only
  std::string caption;
  std::string svg;
};

}  // namespace peerserve::plan
