// `shardtrain plot`: a run's metrics file drawn as an SVG (train/plot.h draws; this parses and writes).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "train/plot.h"

namespace shardtrain::cli {

int run_plot(const std::vector<std::string>& args) {
  std::vector<std::string> paths;
  std::string out;
  train::PlotOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "plot: ", a, " needs a value");
      return args[++i];
    };
    if (a == "--out") out = value();
    else if (a == "--metrics") {
      o.metrics = train::parse_metric_names(value());
      o.require_all = true;  // named ones must be there
    } else if (a.rfind("--", 0) == 0) unknown_option("plot", a);
    else paths.push_back(a);
  }
  ST_CHECK(paths.size() == 1, "plot: expected one RUN_DIR (a run's folder holding metrics.jsonl) or metrics file, found ",
           paths.size(), paths.size() > 1 ? " (`" + paths[1] + "` is extra)" : std::string());
  const std::string file = train::metrics_file_of(paths[0]);
  const train::MetricsLog log = train::read_metrics(file);
  const std::filesystem::path folder = std::filesystem::path(file).parent_path();
  if (out.empty()) out = (folder / "loss.svg").string();
  // the run's folder as the title: "runs/a" for runs/a/metrics.jsonl
  o.title = folder.empty() ? std::filesystem::absolute(file).parent_path().filename().string() : folder.string();
  const std::string svg = train::plot_svg(log, o);
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  ST_CHECK(f.good(), "plot: cannot create `", out, "` (--out)");
  f << svg;
  f.close();
  ST_CHECK(f.good(), "plot: writing `", out, "` (--out) failed (disk full?)");
  size_t points = 0;
  for (const std::string& m : o.metrics)
    if (auto it = log.series.find(m); it != log.series.end()) points += it->second.size();
  std::fputs(fmt::format("plot: wrote {} ({} points from {})\n", out, points, file).c_str(), stdout);
  return 0;
}

}  // namespace shardtrain::cli
