// SVG charts: well-formed XML (checked by Python's parser when available), escaped text, no
// NaN or infinity in coordinates, one element per data point.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "plan/report/svg_chart.h"

namespace peerserve::plan {
namespace {

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

// Parses with /usr/bin/python3's XML parser; skipped when it is not installed.
void expect_well_formed(const std::string& svg) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const auto path = std::filesystem::temp_directory_path() / "peerserve_svg_chart_test.svg";
  std::ofstream(path) << svg;
  const std::string command =
      "/usr/bin/python3 -c \"import sys, xml.dom.minidom; "
      "xml.dom.minidom.parse(sys.argv[1])\" " +
      path.string();
  EXPECT_EQ(std::system(command.c_str()), 0) << svg.substr(0, 400);
  std::filesystem::remove(path);
}

TEST(SvgChart, LineChartWithLogAxisMarkersAndEscaping) {
  LineChart chart;
  chart.title = "latency <vs> EP & friends";
  chart.x_axis.label = "EP degree";
  chart.x_axis.log_scale = true;
  chart.y_axis.label = "us";
  chart.series.push_back(line_series("predicted", {8, 16, 32, 64}, {116, 131, 133, 141}));
  chart.series.push_back(marker_series("paper", {8, 16, 0, -4}, {120, 130, 1, 1}));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  chart.series.push_back(line_series("broken", {8, nan, 32}, {100, 100, nan}));
  chart.x_markers.push_back(ChartMarker{24, "marker", ""});
  chart.y_markers.push_back(ChartMarker{150, "SLO", ""});
  const std::string svg = render_line_chart_svg(chart);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("latency &lt;vs&gt; EP &amp; friends"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // The paper series keeps its two positive-x points on the log axis (+ its legend dot);
  // "broken" has a single usable point, drawn as a marker instead of a line.
  EXPECT_EQ(count(svg, "<circle"), 4);
  EXPECT_EQ(count(svg, "<polyline"), 1);
  expect_well_formed(svg);
}

TEST(SvgChart, EmptyChartsStillRender) {
  LineChart chart;
  chart.title = "nothing";
  const std::string svg = render_line_chart_svg(chart);
  EXPECT_NE(svg.find("nothing"), std::string::npos);
  expect_well_formed(svg);
  BarChart bars;
  expect_well_formed(render_bar_chart_svg(bars));
}

TEST(SvgChart, BarChartHasOneBarPerValue) {
  BarChart chart;
  chart.title = "imbalance";
  chart.y_label = "max / mean";
  chart.series_labels = {"before", "after"};
  chart.categories = {"layer 3", "layer 4", "layer 5"};
  chart.values = {{1.9, 2.1, 1.7}, {1.1, 1.05, 1.2}};
  const std::string svg = render_bar_chart_svg(chart);
  // 6 bars + the background rect + the plot frame + the legend box.
  EXPECT_EQ(count(svg, "<rect"), 6 + 3);
  expect_well_formed(svg);
}

}  // namespace
}  // namespace peerserve::plan
