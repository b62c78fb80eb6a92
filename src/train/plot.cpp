// Metrics plots: the JSONL reader, the SVG panels (axes on "nice" tick values, the step shared
// by every panel) and the braille text curve.
#include "train/plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/svg.h"

namespace shardtrain::train {

namespace {

std::string clipped(const std::string& line) {
  constexpr size_t kShown = 80;
  return line.size() <= kShown ? line : line.substr(0, kShown) + "...";
}

std::string names_of(const MetricsLog& log) {
  std::string out;
  for (const auto& [name, points] : log.series) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

// Tick spacing near range / target, of the form {1, 2, 5} x 10^k.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

struct Axis {
  double lo, hi, step;  // lo and hi are multiples of step
  std::vector<double> ticks() const {
    std::vector<double> t;
    const int n = static_cast<int>(std::llround((hi - lo) / step));
    for (int i = 0; i <= n; ++i) t.push_back(lo + step * i);
    return t;
  }
};

// An axis over [lo, hi] whose ends are ticks; `integer`: ticks at whole numbers (steps).
Axis nice_axis(double lo, double hi, bool integer) {
  if (hi <= lo) {  // one value: a unit-wide window around it
    const double pad = integer ? 1.0 : (lo == 0 ? 1.0 : std::abs(lo) * 0.1);
    lo -= pad;
    hi += pad;
  }
  double step = nice_step(hi - lo, 5);
  if (integer) step = std::max(1.0, std::round(step));
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0;
  return fmt::format("{:.6g}", v);
}

std::string display_name(const std::string& metric) {
  if (metric == "loss") return "training loss";
  if (metric == "eval_loss") return "held-out loss";
  if (metric == "lr") return "learning rate";
  if (metric == "tokens_per_second") return "tokens/s";
  return metric;
}

struct Panel {
  std::vector<std::string> series;
};

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

}  // namespace

std::string metrics_file_of(const std::string& path) {
  return std::filesystem::is_directory(path) ? (std::filesystem::path(path) / "metrics.jsonl").string() : path;
}

MetricsLog read_metrics(const std::string& file) {
  MetricsLog log;
  log.file = file;
  std::ifstream in(file);
  ST_CHECK(in.good(), "metrics file `", file, "`: cannot be opened (",
           std::filesystem::exists(file) ? "not readable" : "not found",
           "); give a run's folder (run.output_dir) holding metrics.jsonl, or the file (logging.metrics_file)");
  std::string line;
  int64_t records = 0;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ST_CHECK(!j.is_discarded() && j.is_object(), "metrics file `", file, "` line ", number,
             ": expected a JSON object, found `", clipped(line), "`");
    ST_CHECK(j.contains("step") && j["step"].is_number_integer(), "metrics file `", file, "` line ", number,
             ": expected an integer \"step\" in `", clipped(line), "`");
    const int64_t step = j["step"].get<int64_t>();
    for (const auto& [name, value] : j.items())
      if (name != "step" && value.is_number()) log.series[name].push_back({step, value.get<double>()});
    ++records;
  }
  ST_CHECK(records > 0, "metrics file `", file, "` is empty: it holds no records yet (the run writes one per step)");
  for (auto& [name, points] : log.series)
    std::stable_sort(points.begin(), points.end(), [](const StepValue& a, const StepValue& b) { return a.step < b.step; });
  return log;
}

std::vector<std::string> parse_metric_names(const std::string& list) {
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    ST_CHECK(!name.empty(), "--metrics `", list, "`: an empty name; expected names separated by commas, "
             "e.g. loss,eval_loss,lr,tokens_per_second");
    names.push_back(name == "tokens_per_s" ? "tokens_per_second" : name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

std::string plot_svg(const MetricsLog& log, const PlotOptions& o) {
  const bool with_loss = std::find(o.metrics.begin(), o.metrics.end(), "loss") != o.metrics.end();
  std::vector<Panel> panels;
  size_t loss_panel = SIZE_MAX;
  std::vector<std::string> evals;  // join the loss panel once it exists
  std::set<std::string> seen;
  for (const std::string& m : o.metrics) {
    if (!seen.insert(m).second) continue;
    if (!log.series.count(m)) {
      ST_CHECK(!o.require_all, "metrics file `", log.file, "` has no metric `", m, "`; it has ", names_of(log));
      continue;
    }
    if (with_loss && m.rfind("eval_loss", 0) == 0) {
      evals.push_back(m);
      continue;
    }
    if (m == "loss") loss_panel = panels.size();
    panels.push_back({{m}});
  }
  if (loss_panel != SIZE_MAX)
    for (const std::string& e : evals) panels[loss_panel].series.push_back(e);
  else
    for (const std::string& e : evals) panels.push_back({{e}});  // loss asked for but absent
  std::string asked;
  for (const std::string& m : o.metrics) asked += (asked.empty() ? "" : ", ") + m;
  ST_CHECK(!panels.empty(), "metrics file `", log.file, "` has none of the metrics ", asked, "; it has ", names_of(log));

  // one step axis for every panel, so that they line up
  double first = INFINITY, last = -INFINITY;
  for (const Panel& p : panels)
    for (const std::string& s : p.series)
      for (const StepValue& v : log.series.at(s)) {
        first = std::min(first, static_cast<double>(v.step));
        last = std::max(last, static_cast<double>(v.step));
      }
  const Axis xa = nice_axis(first, last, true);

  constexpr double kTop = 50, kLeft = 90, kRight = 30, kPanelTop = 34, kPanelBottom = 48;
  const double height = kTop + o.panel_height * static_cast<double>(panels.size()) + 10;
  SvgWriter svg(o.width, height);
  svg.text(o.width / 2, 30, o.title, "middle", 18, "title");
  const double x0 = kLeft, x1 = o.width - kRight;
  const auto px = [&](double step) { return x0 + (step - xa.lo) / (xa.hi - xa.lo) * (x1 - x0); };
  for (size_t k = 0; k < panels.size(); ++k) {
    const Panel& p = panels[k];
    const double top = kTop + o.panel_height * static_cast<double>(k);
    const double y0 = top + kPanelTop, y1 = top + o.panel_height - kPanelBottom;  // plot area, y0 on top
    double lo = INFINITY, hi = -INFINITY;
    for (const std::string& s : p.series)
      for (const StepValue& v : log.series.at(s)) {
        lo = std::min(lo, v.value);
        hi = std::max(hi, v.value);
      }
    const Axis ya = nice_axis(lo, hi, false);
    const auto py = [&](double v) { return y1 - (v - ya.lo) / (ya.hi - ya.lo) * (y1 - y0); };

    std::string title;
    for (const std::string& s : p.series) title += (title.empty() ? "" : " and ") + display_name(s);
    svg.text(x0, top + 22, title, "start", 14, "panel-title");
    for (const double t : ya.ticks()) {
      svg.line(x0, py(t), x1, py(t), "stroke:#e4e4e4;stroke-width:1");
      svg.line(x0 - 5, py(t), x0, py(t), "stroke:#444;stroke-width:1");
      svg.text(x0 - 8, py(t) + 4, tick_label(t, ya.step), "end", 11, "tick-label");
    }
    for (const double t : xa.ticks()) {
      svg.line(px(t), y0, px(t), y1, "stroke:#e4e4e4;stroke-width:1");
      svg.line(px(t), y1, px(t), y1 + 5, "stroke:#444;stroke-width:1");
      svg.text(px(t), y1 + 18, tick_label(t, xa.step), "middle", 11, "tick-label");
    }
    svg.rect(x0, y0, x1 - x0, y1 - y0, "fill:none;stroke:#444;stroke-width:1");
    svg.text(x0 + (x1 - x0) / 2, y1 + 36, "step", "middle", 12, "axis-label");
    svg.text(22, y0 + (y1 - y0) / 2, p.series.front(), "middle", 12, "axis-label", -90);
    for (size_t s = 0; s < p.series.size(); ++s) {
      const std::string color = kColors[s % std::size(kColors)];
      const std::vector<StepValue>& points = log.series.at(p.series[s]);
      std::vector<std::pair<double, double>> xy;
      xy.reserve(points.size());
      for (const StepValue& v : points) xy.emplace_back(px(static_cast<double>(v.step)), py(v.value));
      svg.polyline(xy, p.series[s], "stroke:" + color + ";stroke-width:1.5");
      constexpr size_t kMarkedUpTo = 50;  // sparse series (evaluations) get a dot per point
      if (points.size() <= kMarkedUpTo)
        for (const auto& [x, y] : xy) svg.circle(x, y, 2.5, "fill:" + color);
      if (p.series.size() > 1) {  // legend, top right
        const double ly = y0 + 16 + 18 * static_cast<double>(s);
        svg.line(x1 - 150, ly - 4, x1 - 130, ly - 4, "stroke:" + color + ";stroke-width:2");
        svg.text(x1 - 124, ly, display_name(p.series[s]), "start", 12, "legend");
      }
    }
  }
  return svg.finish();
}

std::string text_curve(const std::vector<StepValue>& all, const TextCurveOptions& o) {
  std::vector<StepValue> points;
  for (const StepValue& p : all)
    if (std::isfinite(p.value)) points.push_back(p);
  if (points.size() < 3 || o.columns < 2 || o.rows < 2) return {};
  std::stable_sort(points.begin(), points.end(), [](const StepValue& a, const StepValue& b) { return a.step < b.step; });
  const int w = 2 * o.columns, h = 4 * o.rows;  // braille: 2 x 4 dots per character
  const int64_t s0 = points.front().step, s1 = points.back().step;
  double lo = INFINITY, hi = -INFINITY;
  for (const StepValue& p : points) {
    lo = std::min(lo, p.value);
    hi = std::max(hi, p.value);
  }
  // each dot column holds the mean of the points that fall in it
  std::vector<double> sum(static_cast<size_t>(w), 0.0);
  std::vector<int> count(static_cast<size_t>(w), 0);
  for (const StepValue& p : points) {
    const int x = s1 == s0 ? 0 : static_cast<int>(std::lround(static_cast<double>(p.step - s0) * (w - 1) / static_cast<double>(s1 - s0)));
    sum[static_cast<size_t>(x)] += p.value;
    ++count[static_cast<size_t>(x)];
  }
  const auto dot_row = [&](double v) {
    return hi == lo ? h / 2 : static_cast<int>(std::lround((hi - v) / (hi - lo) * (h - 1)));
  };
  std::vector<uint8_t> cells(static_cast<size_t>(o.columns * o.rows), 0);
  const auto set = [&](int x, int y) {
    static constexpr uint8_t kBits[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};  // Unicode braille dots
    cells[static_cast<size_t>((y / 4) * o.columns + x / 2)] |= kBits[x % 2][y % 4];
  };
  // consecutive filled columns joined by straight lines (Bresenham)
  int px = -1, py = 0;
  for (int x = 0; x < w; ++x) {
    if (count[static_cast<size_t>(x)] == 0) continue;
    const int y = dot_row(sum[static_cast<size_t>(x)] / count[static_cast<size_t>(x)]);
    if (px < 0) {
      set(x, y);
    } else {
      int cx = px, cy = py;
      const int dx = x - px, dy = -std::abs(y - py), sy = py < y ? 1 : -1;
      int err = dx + dy;
      while (true) {
        set(cx, cy);
        if (cx == x && cy == y) break;
        const int e2 = 2 * err;
        if (e2 >= dy) {
          err += dy;
          ++cx;
        }
        if (e2 <= dx) {
          err += dx;
          cy += sy;
        }
      }
    }
    px = x;
    py = y;
  }
  const std::string top = fmt::format("{:.4g}", hi), bottom = fmt::format("{:.4g}", lo);
  const size_t margin = std::max(top.size(), bottom.size());
  std::string out = fmt::format("{} by step\n", o.label);
  for (int r = 0; r < o.rows; ++r) {
    const bool labelled = r == 0 || r == o.rows - 1;
    out += fmt::format("{:>{}} {}", r == 0 ? top : r == o.rows - 1 ? bottom : "", margin, labelled ? "┤" : "│");
    for (int c = 0; c < o.columns; ++c) {
      const unsigned code = 0x2800u + cells[static_cast<size_t>(r * o.columns + c)];  // UTF-8, 3 bytes
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
    out += '\n';
  }
  out += std::string(margin + 1, ' ') + "└";
  for (int c = 0; c < o.columns; ++c) out += "─";
  const std::string first = std::to_string(s0), last = std::to_string(s1);
  const size_t gap = static_cast<size_t>(o.columns) > first.size() + last.size() ? o.columns - first.size() - last.size() : 1;
  out += fmt::format("\n{:{}}{}{:{}}{}", "", margin + 2, first, "", gap, last);
  return out;
}

}  // namespace shardtrain::train
