// Metrics plots: the metrics file read (and its errors, by file and line), the SVG's structure
// (balanced elements, a polyline per metric with a point per record, axes and labels) and the
// braille text curve, decoded dot by dot.
#include "train/plot.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/svg.h"

namespace {

namespace fs = std::filesystem;
using shardtrain::train::MetricsLog;
using shardtrain::train::StepValue;

class PlotFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_plot_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  template <typename F>
  std::string error_of(F f) {
    try {
      f();
    } catch (const shardtrain::Error& e) {
      return e.what();
    }
    return "(none)";
  }
  fs::path dir_;
};

// Seven training steps (step 4's loss non-finite, written as null), evaluations after steps 3
// and 7, and a GPU board record, as a run writes them.
std::string sample_metrics() {
  std::string s;
  for (int step = 1; step <= 7; ++step) {
    const std::string loss = step == 4 ? "null" : std::to_string(5.0 - 0.4 * step);
    s += "{\"step\":" + std::to_string(step) + ",\"loss\":" + loss + ",\"lr\":" + std::to_string(1e-4 * step) +
         ",\"grad_norm\":1.5,\"tokens_per_second\":" + std::to_string(1000 + 10 * step) + "}\n";
    if (step == 3 || step == 7) s += "{\"step\":" + std::to_string(step) + ",\"eval_loss\":" + std::to_string(4.9 - 0.3 * step) + "}\n";
    if (step == 5) s += "\n{\"step\":5,\"gpu_sm_mhz\":1980.0,\"note\":\"text fields are not plotted\"}\n";
  }
  return s;
}

TEST_F(PlotFiles, ReadsEverySeriesInStepOrder) {
  const MetricsLog log = shardtrain::train::read_metrics(write("metrics.jsonl", sample_metrics()));
  EXPECT_EQ(log.series.at("loss").size(), 6u);  // step 4's null left out
  EXPECT_EQ(log.series.at("lr").size(), 7u);
  EXPECT_EQ(log.series.at("eval_loss").size(), 2u);
  EXPECT_EQ(log.series.at("gpu_sm_mhz").size(), 1u);
  EXPECT_EQ(log.series.count("note"), 0u);
  EXPECT_EQ(log.series.count("step"), 0u);
  EXPECT_EQ(log.series.at("eval_loss")[1].step, 7);
  EXPECT_DOUBLE_EQ(log.series.at("eval_loss")[1].value, 4.9 - 0.3 * 7);
  EXPECT_EQ(log.series.at("loss")[3].step, 5);
  EXPECT_EQ(shardtrain::train::metrics_file_of(dir_.string()), (dir_ / "metrics.jsonl").string());
  EXPECT_EQ(shardtrain::train::metrics_file_of((dir_ / "metrics.jsonl").string()), (dir_ / "metrics.jsonl").string());
}

TEST_F(PlotFiles, BadFilesAreNamedWithTheLine) {
  using shardtrain::train::read_metrics;
  const std::string missing = (dir_ / "none.jsonl").string();
  EXPECT_EQ(error_of([&] { read_metrics(missing); }),
            "metrics file `" + missing + "`: cannot be opened (not found); give a run's folder (run.output_dir) "
            "holding metrics.jsonl, or the file (logging.metrics_file)");
  const std::string empty = write("empty.jsonl", "\n\n");
  EXPECT_EQ(error_of([&] { read_metrics(empty); }),
            "metrics file `" + empty + "` is empty: it holds no records yet (the run writes one per step)");
  const std::string broken = write("broken.jsonl", "{\"step\":1,\"loss\":3}\n\n{\"step\":2,\"loss\":\n");
  EXPECT_EQ(error_of([&] { read_metrics(broken); }),
            "metrics file `" + broken + "` line 3: expected a JSON object, found `{\"step\":2,\"loss\":`");
  const std::string array = write("array.jsonl", "[1, 2]\n");
  EXPECT_EQ(error_of([&] { read_metrics(array); }),
            "metrics file `" + array + "` line 1: expected a JSON object, found `[1, 2]`");
  const std::string no_step = write("no_step.jsonl", "{\"step\":1,\"loss\":3}\n{\"loss\":2}\n");
  EXPECT_EQ(error_of([&] { read_metrics(no_step); }),
            "metrics file `" + no_step + "` line 2: expected an integer \"step\" in `{\"loss\":2}`");
  const std::string long_line = write("long.jsonl", "{\"step\":1.5,\"loss\":\"" + std::string(200, 'x') + "\"}\n");
  const std::string e = error_of([&] { read_metrics(long_line); });
  EXPECT_NE(e.find("line 1: expected an integer \"step\" in `{\"step\":1.5,\"loss\":\"xxx"), std::string::npos) << e;
  EXPECT_NE(e.find("xxx...`"), std::string::npos) << "a long line is clipped: " << e;
}

TEST(PlotMetricNames, ParsesTheListWithItsAlias) {
  using shardtrain::train::parse_metric_names;
  EXPECT_EQ(parse_metric_names("loss,eval_loss, lr ,tokens_per_s"),
            (std::vector<std::string>{"loss", "eval_loss", "lr", "tokens_per_second"}));
  EXPECT_EQ(parse_metric_names("grad_norm"), (std::vector<std::string>{"grad_norm"}));
  for (const char* bad : {"", "loss,,lr", "loss,"}) {
    try {
      parse_metric_names(bad);
      ADD_FAILURE() << "no error for `" << bad << "`";
    } catch (const shardtrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--metrics `" + std::string(bad) + "`: an empty name"), std::string::npos)
          << e.what();
    }
  }
}

// Elements open and close in order (a small XML check: <name ...>, </name>, <name .../>).
void expect_balanced(const std::string& xml) {
  std::vector<std::string> open;
  const std::regex tag(R"(<(/?)([A-Za-z?][A-Za-z0-9:_-]*)[^<>]*?(/?)>)");
  size_t elements = 0;
  for (auto it = std::sregex_iterator(xml.begin(), xml.end(), tag); it != std::sregex_iterator(); ++it) {
    const std::string closing = (*it)[1], name = (*it)[2], self = (*it)[3];
    if (name[0] == '?') continue;  // the declaration
    ++elements;
    if (!self.empty()) continue;
    if (closing.empty()) {
      open.push_back(name);
    } else {
      ASSERT_FALSE(open.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(open.back(), name) << "</" << name << "> closes <" << open.back() << ">";
      open.pop_back();
    }
  }
  EXPECT_TRUE(open.empty()) << "<" << (open.empty() ? "" : open.back()) << "> left open";
  EXPECT_GT(elements, 10u);
  // no stray markup characters outside tags
  const std::string text = std::regex_replace(xml, tag, "");
  EXPECT_EQ(text.find('<'), std::string::npos);
  EXPECT_EQ(text.find('>'), std::string::npos);
}

// The number of points of the polyline tagged `series`, or -1 without one.
int polyline_points(const std::string& svg, const std::string& series) {
  const std::string key = "<polyline data-series=\"" + series + "\" points=\"";
  const size_t at = svg.find(key);
  if (at == std::string::npos) return -1;
  const size_t start = at + key.size(), end = svg.find('"', start);
  int n = 0;
  for (size_t i = start; i < end; ++i) n += svg[i] == ',';
  return n;
}

int count(const std::string& text, const std::string& piece) {
  int n = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

TEST_F(PlotFiles, SvgHasAPanelPerMetricWithAxes) {
  const MetricsLog log = shardtrain::train::read_metrics(write("metrics.jsonl", sample_metrics()));
  shardtrain::train::PlotOptions o;
  o.title = "runs/<a & b>";
  const std::string svg = shardtrain::train::plot_svg(log, o);
  expect_balanced(svg);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find(">runs/&lt;a &amp; b&gt;</text>"), std::string::npos) << "the title, escaped";
  EXPECT_EQ(count(svg, "<polyline "), 4);
  EXPECT_EQ(polyline_points(svg, "loss"), 6);
  EXPECT_EQ(polyline_points(svg, "eval_loss"), 2);
  EXPECT_EQ(polyline_points(svg, "lr"), 7);
  EXPECT_EQ(polyline_points(svg, "tokens_per_second"), 7);
  EXPECT_EQ(polyline_points(svg, "grad_norm"), -1) << "not among the defaults";
  // three panels: the held-out loss with the training loss, with a legend
  EXPECT_EQ(count(svg, "class=\"panel-title\""), 3);
  EXPECT_NE(svg.find(">training loss and held-out loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">learning rate</text>"), std::string::npos);
  EXPECT_NE(svg.find(">tokens/s</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"legend\""), 2);
  // axes: "step" under each panel, the metric beside it, ticks labelled on both
  EXPECT_EQ(count(svg, ">step</text>"), 3);
  EXPECT_NE(svg.find("transform=\"rotate(-90"), std::string::npos);
  for (const char* step : {"0", "2", "4", "6", "8"})  // steps 1 to 7 on ticks 2 apart, the ends ticks too
    EXPECT_GE(count(svg, std::string("class=\"tick-label\">") + step + "</text>"), 3) << step;
  EXPECT_EQ(count(svg, "class=\"tick-label\">7</text>"), 0);
  EXPECT_NE(svg.find("class=\"tick-label\">1000</text>"), std::string::npos) << "tokens/s from 1010 to 1070";
  EXPECT_NE(svg.find("class=\"tick-label\">0.0008</text>"), std::string::npos) << "lr up to 7e-4";
  EXPECT_GT(count(svg, "class=\"tick-label\""), 20);
}

// Every point of a polyline lies inside its panel's frame, ascending steps left to right.
TEST_F(PlotFiles, PointsLieInTheFrameInStepOrder) {
  const MetricsLog log = shardtrain::train::read_metrics(write("metrics.jsonl", sample_metrics()));
  shardtrain::train::PlotOptions o;
  o.metrics = {"loss"};
  const std::string svg = shardtrain::train::plot_svg(log, o);
  std::smatch frame;
  ASSERT_TRUE(std::regex_search(svg, frame, std::regex(R"re(<rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)" style="fill:none)re")));
  const double fx = std::stod(frame[1]), fy = std::stod(frame[2]), fw = std::stod(frame[3]), fh = std::stod(frame[4]);
  std::smatch pts;
  ASSERT_TRUE(std::regex_search(svg, pts, std::regex(R"re(data-series="loss" points="([^"]*)")re")));
  std::istringstream in(pts[1].str());
  std::string xy;
  double last_x = -1;
  std::vector<double> ys;
  while (in >> xy) {
    const double x = std::stod(xy.substr(0, xy.find(','))), y = std::stod(xy.substr(xy.find(',') + 1));
    EXPECT_GE(x, fx);
    EXPECT_LE(x, fx + fw);
    EXPECT_GE(y, fy);
    EXPECT_LE(y, fy + fh);
    EXPECT_GT(x, last_x);
    last_x = x;
    ys.push_back(y);
  }
  ASSERT_EQ(ys.size(), 6u);
  for (size_t i = 1; i < ys.size(); ++i) EXPECT_GT(ys[i], ys[i - 1]) << "a falling loss goes down the panel";
}

TEST_F(PlotFiles, MetricsAskedForMustBeThere) {
  const MetricsLog log = shardtrain::train::read_metrics(write("metrics.jsonl", sample_metrics()));
  shardtrain::train::PlotOptions o;
  o.metrics = {"loss", "grad_norm"};
  o.require_all = true;
  const std::string svg = shardtrain::train::plot_svg(log, o);
  EXPECT_EQ(polyline_points(svg, "grad_norm"), 7);
  EXPECT_EQ(count(svg, "<polyline "), 2);
  o.metrics = {"loss", "grad_nrom"};
  EXPECT_EQ(error_of([&] { shardtrain::train::plot_svg(log, o); }),
            "metrics file `" + log.file + "` has no metric `grad_nrom`; it has eval_loss, gpu_sm_mhz, grad_norm, loss, "
            "lr, tokens_per_second");
  // the defaults leave out what a run lacks (no evaluation), but need one of them
  const MetricsLog no_eval = shardtrain::train::read_metrics(write("no_eval.jsonl", "{\"step\":1,\"loss\":2.5}\n"));
  EXPECT_EQ(count(shardtrain::train::plot_svg(no_eval, {}), "<polyline "), 1);
  const MetricsLog other = shardtrain::train::read_metrics(write("other.jsonl", "{\"step\":1,\"gpu_sm_mhz\":1000}\n"));
  EXPECT_EQ(error_of([&] { shardtrain::train::plot_svg(other, {}); }),
            "metrics file `" + other.file + "` has none of the metrics loss, eval_loss, lr, tokens_per_second; it has "
            "gpu_sm_mhz");
}

TEST(Svg, EscapesText) {
  EXPECT_EQ(shardtrain::train::xml_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
  shardtrain::train::SvgWriter w(10, 20);
  w.text(1, 2, "x < y", "start", 9);
  const std::string svg = w.finish();
  EXPECT_NE(svg.find(">x &lt; y</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("width=\"10\" height=\"20\""), std::string::npos) << svg;
}

// ---- the text curve ----

// The braille dots of a curve's plot rows as a grid of booleans [row][column].
std::vector<std::vector<bool>> dots(const std::string& curve, int columns, int rows) {
  std::vector<std::string> lines;
  std::istringstream in(curve);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(lines.size(), static_cast<size_t>(rows + 3)) << curve;  // title, rows, axis, step labels
  std::vector<std::vector<bool>> grid(static_cast<size_t>(4 * rows), std::vector<bool>(static_cast<size_t>(2 * columns)));
  static constexpr int kBits[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};
  for (int r = 0; r < rows && r + 1 < static_cast<int>(lines.size()); ++r) {
    const std::string& l = lines[static_cast<size_t>(r + 1)];
    const size_t axis = std::min(l.find("┤"), l.find("│"));  // the plot starts after the axis
    EXPECT_NE(axis, std::string::npos) << l;
    if (axis == std::string::npos) continue;
    size_t at = axis + std::string("┤").size();
    for (int c = 0; c < columns; ++c, at += 3) {
      EXPECT_LE(at + 3, l.size()) << l;
      if (at + 3 > l.size()) break;
      const unsigned code = ((static_cast<unsigned char>(l[at]) & 0x0F) << 12) |
                            ((static_cast<unsigned char>(l[at + 1]) & 0x3F) << 6) |
                            (static_cast<unsigned char>(l[at + 2]) & 0x3F);
      EXPECT_EQ(code & 0xFF00u, 0x2800u) << "row " << r << " column " << c;
      for (int x = 0; x < 2; ++x)
        for (int y = 0; y < 4; ++y)
          grid[static_cast<size_t>(4 * r + y)][static_cast<size_t>(2 * c + x)] = (code & kBits[x][y]) != 0;
    }
  }
  return grid;
}

TEST(TextCurve, AFallingLossFromTopLeftToBottomRight) {
  std::vector<StepValue> points;
  for (int s = 1; s <= 200; ++s) points.push_back({s, 2.0 + 8.0 * std::exp(-0.03 * s)});
  const std::string curve = shardtrain::train::text_curve(points);
  const auto grid = dots(curve, 60, 8);
  ASSERT_EQ(grid.size(), 32u);
  EXPECT_TRUE(grid[0][0]) << curve;        // the first (highest) value, top left
  EXPECT_TRUE(grid[31][119]) << curve;     // the last (lowest), bottom right
  // a line: every dot column holds a dot, and columns never rise to the right
  int previous_top = -1;
  for (int x = 0; x < 120; ++x) {
    int top = -1;
    for (int y = 0; y < 32 && top < 0; ++y)
      if (grid[static_cast<size_t>(y)][static_cast<size_t>(x)]) top = y;
    ASSERT_GE(top, 0) << "column " << x << " empty\n" << curve;
    EXPECT_GE(top, previous_top) << "column " << x << "\n" << curve;
    previous_top = top;
  }
  // labels: the highest and lowest values beside the top and bottom rows, the steps below
  const std::string high = fmt::format("{:.4g}", points.front().value), low = fmt::format("{:.4g}", points.back().value);
  EXPECT_EQ(curve.rfind("loss by step\n", 0), 0u) << curve;
  EXPECT_NE(curve.find("\n" + high + " ┤"), std::string::npos) << curve;
  EXPECT_NE(curve.find("\n" + std::string(high.size() - low.size(), ' ') + low + " ┤"), std::string::npos) << curve;
  EXPECT_NE(curve.find("└" ), std::string::npos);
  EXPECT_EQ(curve.substr(curve.rfind('\n') + 1),
            std::string(high.size() + 2, ' ') + "1" + std::string(60 - 4, ' ') + "200");
  EXPECT_NE(curve.back(), '\n');
}

TEST(TextCurve, SizesFlatLinesGapsAndTooFewPoints) {
  using shardtrain::train::text_curve;
  EXPECT_EQ(text_curve({}), "");
  EXPECT_EQ(text_curve({{1, 3.0}, {2, 2.5}}), "");
  EXPECT_EQ(text_curve({{1, 3.0}, {2, NAN}, {3, INFINITY}, {4, 2.5}}), "") << "non-finite points do not count";
  // a constant: one row of dots across the middle
  const auto flat = dots(text_curve({{10, 1.5}, {20, 1.5}, {30, 1.5}}), 60, 8);
  for (int y = 0; y < 32; ++y) {
    int n = 0;
    for (int x = 0; x < 120; ++x) n += flat[static_cast<size_t>(y)][static_cast<size_t>(x)] ? 1 : 0;
    EXPECT_EQ(n, y == 16 ? 120 : 0) << "dot row " << y;
  }
  // other sizes and a label; three points joined into a V
  shardtrain::train::TextCurveOptions o;
  o.columns = 20;
  o.rows = 4;
  o.label = "eval";
  const std::string v = text_curve({{0, 4.0}, {5, 0.0}, {10, 4.0}}, o);
  EXPECT_EQ(v.rfind("eval by step\n", 0), 0u) << v;
  const auto grid = dots(v, 20, 4);
  EXPECT_TRUE(grid[0][0]) << v;
  EXPECT_TRUE(grid[15][20] || grid[15][19]) << v;
  EXPECT_TRUE(grid[0][39]) << v;
  for (int x = 0; x < 40; ++x) {
    bool any = false;
    for (int y = 0; y < 16; ++y) any = any || grid[static_cast<size_t>(y)][static_cast<size_t>(x)];
    EXPECT_TRUE(any) << "column " << x << " joined\n" << v;
  }
}

}  // namespace
