#include "plan/report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace peerserve::plan {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Plot area margins in pixels: room for the title, tick labels, axis labels and legend.
constexpr double kLeft = 78.0;
constexpr double kRight = 24.0;
constexpr double kTop = 44.0;
constexpr double kBottom = 58.0;

std::string escape_xml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_number(double value) {
  char buffer[64];
  const double magnitude = std::fabs(value);
  if (value == 0.0) return "0";
  if (magnitude >= 1e6 || magnitude < 1e-3) {
    std::snprintf(buffer, sizeof(buffer), "%.3g", value);
  } else if (magnitude >= 100.0) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", value);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  }
  return buffer;
}

std::string px(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", value);
  return buffer;
}

// Maps data values to pixels along one axis (linear or log10).
class AxisScale {
 public:
  AxisScale(double lo, double hi, bool log_scale, double pixel_lo, double pixel_hi)
      : log_(log_scale), pixel_lo_(pixel_lo), pixel_hi_(pixel_hi) {
    lo_ = log_ ? std::log10(lo) : lo;
    hi_ = log_ ? std::log10(hi) : hi;
    if (!(hi_ > lo_)) hi_ = lo_ + 1.0;
  }
  bool usable(double value) const { return std::isfinite(value) && (!log_ || value > 0.0); }
  double to_pixel(double value) const {
    const double v = log_ ? std::log10(value) : value;
    return pixel_lo_ + (v - lo_) / (hi_ - lo_) * (pixel_hi_ - pixel_lo_);
  }
  // Tick positions in data units.
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log_) {
      for (double e = std::floor(lo_); e <= std::ceil(hi_) + 1e-9; e += 1.0) {
        const double v = std::pow(10.0, e);
        if (e >= lo_ - 1e-9 && e <= hi_ + 1e-9) out.push_back(v);
      }
      if (out.size() < 2) {  // less than a decade: use 1-2-5 steps
        out.clear();
        for (double e = std::floor(lo_); e <= std::ceil(hi_); e += 1.0) {
          for (double m : {1.0, 2.0, 5.0}) {
            const double v = m * std::pow(10.0, e);
            const double lv = std::log10(v);
            if (lv >= lo_ - 1e-9 && lv <= hi_ + 1e-9) out.push_back(v);
          }
        }
      }
      return out;
    }
    const double span = hi_ - lo_;
    const double raw_step = span / 6.0;
    const double power = std::pow(10.0, std::floor(std::log10(raw_step)));
    double step = power;
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
      if (m * power >= raw_step) {
        step = m * power;
        break;
      }
    }
    const double first = std::ceil(lo_ / step - 1e-9) * step;
    for (double v = first; v <= hi_ + step * 1e-6; v += step) {
      out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    }
    return out;
  }

 private:
  bool log_;
  double lo_ = 0.0;
  double hi_ = 1.0;
  double pixel_lo_;
  double pixel_hi_;
};

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v, bool log_scale) {
    if (!std::isfinite(v) || (log_scale && v <= 0.0)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(hi >= lo); }
};

// Final [lo, hi] for an axis: explicit bounds win; linear axes get 5% padding and include 0
// when `include_zero` (bars and most y quantities start at zero).
std::pair<double, double> axis_bounds(Range range, const ChartAxis& axis, bool include_zero) {
  if (range.empty()) range = {axis.log_scale ? 1.0 : 0.0, axis.log_scale ? 10.0 : 1.0};
  double lo = range.lo;
  double hi = range.hi;
  if (axis.log_scale) {
    if (hi <= lo) {
      lo /= 2.0;
      hi *= 2.0;
    } else {
      lo /= 1.15;
      hi *= 1.15;
    }
  } else {
    if (include_zero) {
      lo = std::min(lo, 0.0);
      hi = std::max(hi, 0.0);
    }
    if (hi <= lo) {
      hi = lo + (lo == 0.0 ? 1.0 : std::fabs(lo) * 0.1);
    }
    const double pad = (hi - lo) * 0.05;
    if (!(include_zero && lo == 0.0)) lo -= pad;
    hi += pad;
  }
  if (axis.min && (!axis.log_scale || *axis.min > 0.0)) lo = *axis.min;
  if (axis.max && (!axis.log_scale || *axis.max > 0.0)) hi = *axis.max;
  if (!(hi > lo)) hi = lo + 1.0;
  return {lo, hi};
}

void write_header(std::ostringstream& svg, int width, int height, const std::string& title) {
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << px(width / 2.0) << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\""
      << " font-weight=\"bold\">" << escape_xml(title) << "</text>\n";
}

void write_axes_frame(std::ostringstream& svg, double x0, double y0, double x1, double y1) {
  svg << "<rect x=\"" << px(x0) << "\" y=\"" << px(y1) << "\" width=\"" << px(x1 - x0)
      << "\" height=\"" << px(y0 - y1) << "\" fill=\"none\" stroke=\"#333\"/>\n";
}

struct LegendEntry {
  std::string label;
  std::string color;
  bool dashed = false;
  bool marker = false;  // a dot instead of a line
};

// Width of the legend column drawn to the right of the plot (0 without entries).
double legend_width(const std::vector<LegendEntry>& entries) {
  size_t longest = 0;
  for (const auto& e : entries) longest = std::max(longest, e.label.size());
  return entries.empty() ? 0.0 : 42.0 + 6.6 * static_cast<double>(longest);
}

void write_legend(std::ostringstream& svg, const std::vector<LegendEntry>& entries, double x,
                  double y_top) {
  if (entries.empty()) return;
  const double box_width = legend_width(entries) - 8.0;
  const double box_height = 8.0 + 16.0 * static_cast<double>(entries.size());
  svg << "<rect x=\"" << px(x) << "\" y=\"" << px(y_top) << "\" width=\"" << px(box_width)
      << "\" height=\"" << px(box_height) << "\" fill=\"white\" stroke=\"#999\"/>\n";
  for (size_t i = 0; i < entries.size(); ++i) {
    const LegendEntry& e = entries[i];
    const double ly = y_top + 14.0 + 16.0 * static_cast<double>(i);
    if (e.marker) {
      svg << "<circle cx=\"" << px(x + 16) << "\" cy=\"" << px(ly - 4) << "\" r=\"3.5\" fill=\""
          << e.color << "\"/>\n";
    } else {
      svg << "<line x1=\"" << px(x + 6) << "\" y1=\"" << px(ly - 4) << "\" x2=\"" << px(x + 26)
          << "\" y2=\"" << px(ly - 4) << "\" stroke=\"" << e.color << "\" stroke-width=\"2.5\""
          << (e.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>\n";
    }
    svg << "<text x=\"" << px(x + 30) << "\" y=\"" << px(ly) << "\">" << escape_xml(e.label)
        << "</text>\n";
  }
}

}  // namespace

ChartSeries line_series(std::string label, std::vector<double> x, std::vector<double> y) {
  ChartSeries series;
  series.label = std::move(label);
  series.x = std::move(x);
  series.y = std::move(y);
  return series;
}

ChartSeries marker_series(std::string label, std::vector<double> x, std::vector<double> y) {
  ChartSeries series = line_series(std::move(label), std::move(x), std::move(y));
  series.style = SeriesStyle::kMarkers;
  return series;
}

std::string render_line_chart_svg(const LineChart& chart) {
  // Colours first: the legend's width widens the picture, not the plot.
  std::vector<std::string> colors;
  std::vector<LegendEntry> legend;
  int palette_index = 0;
  for (const auto& series : chart.series) {
    colors.push_back(series.color.empty() ? kPalette[palette_index++ % kPaletteSize]
                                          : series.color);
    if (!series.label.empty()) {
      legend.push_back(
          {series.label, colors.back(), series.dashed, series.style == SeriesStyle::kMarkers});
    }
  }
  const double plot_width = std::max(chart.width, 200);
  const double width = plot_width + legend_width(legend);
  const double height = std::max(chart.height, 150);
  const double x0 = kLeft;
  const double x1 = plot_width - kRight;
  const double y0 = height - kBottom;  // bottom of the plot area (pixel y grows downwards)
  const double y1 = kTop;

  Range x_range;
  Range y_range;
  for (const auto& series : chart.series) {
    const size_t n = std::min(series.x.size(), series.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
      if (chart.x_axis.log_scale && series.x[i] <= 0.0) continue;
      if (chart.y_axis.log_scale && series.y[i] <= 0.0) continue;
      x_range.add(series.x[i], chart.x_axis.log_scale);
      y_range.add(series.y[i], chart.y_axis.log_scale);
    }
  }
  for (const auto& marker : chart.x_markers) x_range.add(marker.value, chart.x_axis.log_scale);
  for (const auto& marker : chart.y_markers) y_range.add(marker.value, chart.y_axis.log_scale);
  const auto [x_lo, x_hi] = axis_bounds(x_range, chart.x_axis, /*include_zero=*/false);
  const auto [y_lo, y_hi] = axis_bounds(y_range, chart.y_axis, /*include_zero=*/true);
  const AxisScale xs(x_lo, x_hi, chart.x_axis.log_scale, x0, x1);
  const AxisScale ys(y_lo, y_hi, chart.y_axis.log_scale, y0, y1);

  std::ostringstream svg;
  write_header(svg, static_cast<int>(width), static_cast<int>(height), chart.title);

  // Grid and tick labels.
  for (double t : xs.ticks()) {
    if (!xs.usable(t)) continue;
    const double p = xs.to_pixel(t);
    if (p < x0 - 0.5 || p > x1 + 0.5) continue;
    svg << "<line x1=\"" << px(p) << "\" y1=\"" << px(y0) << "\" x2=\"" << px(p) << "\" y2=\""
        << px(y1) << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << px(p) << "\" y=\"" << px(y0 + 16) << "\" text-anchor=\"middle\">"
        << format_number(t) << "</text>\n";
  }
  for (double t : ys.ticks()) {
    if (!ys.usable(t)) continue;
    const double p = ys.to_pixel(t);
    if (p > y0 + 0.5 || p < y1 - 0.5) continue;
    svg << "<line x1=\"" << px(x0) << "\" y1=\"" << px(p) << "\" x2=\"" << px(x1) << "\" y2=\""
        << px(p) << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << px(x0 - 6) << "\" y=\"" << px(p + 4) << "\" text-anchor=\"end\">"
        << format_number(t) << "</text>\n";
  }
  write_axes_frame(svg, x0, y0, x1, y1);
  svg << "<text x=\"" << px((x0 + x1) / 2) << "\" y=\"" << px(height - 16)
      << "\" text-anchor=\"middle\">" << escape_xml(chart.x_axis.label) << "</text>\n";
  svg << "<text transform=\"translate(18," << px((y0 + y1) / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape_xml(chart.y_axis.label) << "</text>\n";

  // Clip the data to the plot area so that explicit axis bounds cut lines cleanly.
  svg << "<clipPath id=\"plot\"><rect x=\"" << px(x0) << "\" y=\"" << px(y1) << "\" width=\""
      << px(x1 - x0) << "\" height=\"" << px(y0 - y1) << "\"/></clipPath>\n";
  svg << "<g clip-path=\"url(#plot)\">\n";
  for (const auto& marker : chart.x_markers) {
    if (!xs.usable(marker.value)) continue;
    const double p = xs.to_pixel(marker.value);
    const std::string color = marker.color.empty() ? "#777" : marker.color;
    svg << "<line x1=\"" << px(p) << "\" y1=\"" << px(y0) << "\" x2=\"" << px(p) << "\" y2=\""
        << px(y1) << "\" stroke=\"" << color << "\" stroke-dasharray=\"2,3\"/>\n";
    svg << "<text x=\"" << px(p + 3) << "\" y=\"" << px(y1 + 12) << "\" fill=\"" << color
        << "\" font-size=\"11\">" << escape_xml(marker.label) << "</text>\n";
  }
  for (const auto& marker : chart.y_markers) {
    if (!ys.usable(marker.value)) continue;
    const double p = ys.to_pixel(marker.value);
    const std::string color = marker.color.empty() ? "#777" : marker.color;
    svg << "<line x1=\"" << px(x0) << "\" y1=\"" << px(p) << "\" x2=\"" << px(x1) << "\" y2=\""
        << px(p) << "\" stroke=\"" << color << "\" stroke-dasharray=\"2,3\"/>\n";
    svg << "<text x=\"" << px(x0 + 4) << "\" y=\"" << px(p - 3) << "\" fill=\"" << color
        << "\" font-size=\"11\">" << escape_xml(marker.label) << "</text>\n";
  }

  for (size_t s = 0; s < chart.series.size(); ++s) {
    const ChartSeries& series = chart.series[s];
    const std::string& color = colors[s];
    std::vector<std::pair<double, double>> points;
    const size_t n = std::min(series.x.size(), series.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!xs.usable(series.x[i]) || !ys.usable(series.y[i])) continue;
      points.emplace_back(xs.to_pixel(series.x[i]), ys.to_pixel(series.y[i]));
    }
    const bool line = series.style != SeriesStyle::kMarkers;
    const bool markers = series.style != SeriesStyle::kLine;
    if (line && points.size() >= 2) {
      svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\""
          << (series.dashed ? " stroke-dasharray=\"6,4\"" : "") << " points=\"";
      for (const auto& [px_x, px_y] : points) svg << px(px_x) << "," << px(px_y) << " ";
      svg << "\"/>\n";
    }
    if (markers || points.size() == 1) {
      for (const auto& [px_x, px_y] : points) {
        svg << "<circle cx=\"" << px(px_x) << "\" cy=\"" << px(px_y) << "\" r=\"3.5\" fill=\""
            << color << "\"/>\n";
      }
    }
  }
  svg << "</g>\n";
  write_legend(svg, legend, x1 + 12.0, y1);
  svg << "</svg>\n";
  return svg.str();
}

std::string render_bar_chart_svg(const BarChart& chart) {
  const size_t num_series = chart.values.size();
  std::vector<std::string> colors;
  std::vector<LegendEntry> legend;
  for (size_t s = 0; s < num_series; ++s) {
    colors.push_back(kPalette[s % kPaletteSize]);
    if (s < chart.series_labels.size()) legend.push_back({chart.series_labels[s], colors[s]});
  }
  const double plot_width = std::max(chart.width, 200);
  const double width = plot_width + legend_width(legend);
  const double height = std::max(chart.height, 150);
  const double x0 = kLeft;
  const double x1 = plot_width - kRight;
  const double y0 = height - kBottom;
  const double y1 = kTop;

  Range y_range;
  for (const auto& row : chart.values) {
    for (double v : row) y_range.add(v, /*log_scale=*/false);
  }
  ChartAxis y_axis;
  const auto [y_lo, y_hi] = axis_bounds(y_range, y_axis, /*include_zero=*/true);
  const AxisScale ys(y_lo, y_hi, /*log_scale=*/false, y0, y1);

  std::ostringstream svg;
  write_header(svg, static_cast<int>(width), static_cast<int>(height), chart.title);
  for (double t : ys.ticks()) {
    const double p = ys.to_pixel(t);
    if (p > y0 + 0.5 || p < y1 - 0.5) continue;
    svg << "<line x1=\"" << px(x0) << "\" y1=\"" << px(p) << "\" x2=\"" << px(x1) << "\" y2=\""
        << px(p) << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << px(x0 - 6) << "\" y=\"" << px(p + 4) << "\" text-anchor=\"end\">"
        << format_number(t) << "</text>\n";
  }
  write_axes_frame(svg, x0, y0, x1, y1);
  svg << "<text transform=\"translate(18," << px((y0 + y1) / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape_xml(chart.y_label) << "</text>\n";

  const size_t num_categories = chart.categories.size();
  if (num_categories > 0 && num_series > 0) {
    const double group_width = (x1 - x0) / static_cast<double>(num_categories);
    const double bar_width = group_width * 0.8 / static_cast<double>(num_series);
    const double zero_pixel = ys.to_pixel(std::max(y_lo, 0.0));
    for (size_t c = 0; c < num_categories; ++c) {
      const double group_x = x0 + group_width * static_cast<double>(c) + group_width * 0.1;
      for (size_t s = 0; s < num_series; ++s) {
        if (c >= chart.values[s].size() || !std::isfinite(chart.values[s][c])) continue;
        const double top = ys.to_pixel(chart.values[s][c]);
        const double bx = group_x + bar_width * static_cast<double>(s);
        svg << "<rect x=\"" << px(bx) << "\" y=\"" << px(std::min(top, zero_pixel)) << "\" width=\""
            << px(bar_width * 0.92) << "\" height=\"" << px(std::fabs(zero_pixel - top))
            << "\" fill=\"" << colors[s] << "\"/>\n";
      }
      svg << "<text x=\"" << px(group_x + group_width * 0.4) << "\" y=\"" << px(y0 + 16)
          << "\" text-anchor=\"middle\" font-size=\"11\">" << escape_xml(chart.categories[c])
          << "</text>\n";
    }
  }
  write_legend(svg, legend, x1 + 12.0, y1);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace peerserve::plan
