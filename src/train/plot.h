// A run's metrics drawn: read from its metrics.jsonl (train/metrics.h), then as an SVG file with
// one panel per metric, or as a few lines of text for the end of a run on the terminal.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardtrain::train {

struct StepValue {
  int64_t step;
  double value;
};

// Every numeric field of a metrics file by name, as (step, value) in step order.
struct MetricsLog {
  std::string file;
  std::map<std::string, std::vector<StepValue>> series;
};

// RUN_DIR/metrics.jsonl for a folder, `path` itself for a file.
std::string metrics_file_of(const std::string& path);

// Reads a metrics.jsonl: one JSON object per line with an integer "step"; its other numeric
// fields join their series (null, as a non-finite value is written, is skipped; blank lines
// too). Errors name the file, and the line (number and text) of a record that is not an
// object with a step; a missing file or one without records is an error too.
MetricsLog read_metrics(const std::string& file);

// The metric names of a --metrics list ("loss,eval_loss,lr"): tokens_per_s means
// tokens_per_second. Errors name an empty entry.
std::vector<std::string> parse_metric_names(const std::string& list);

struct PlotOptions {
  std::string title;  // on top, e.g. the run's folder
  // one panel each, in order; eval_loss (and eval_loss/<source>) share the panel of loss
  std::vector<std::string> metrics = {"loss", "eval_loss", "lr", "tokens_per_second"};
  // a metric the file lacks: an error naming it and the file's metrics (else it is left out,
  // as the defaults are when a run had no evaluation)
  bool require_all = false;
  double width = 900;          // pixels
  double panel_height = 260;   // pixels per panel
};

// The SVG document. Throws Error naming the file when none of the metrics has a point.
std::string plot_svg(const MetricsLog& log, const PlotOptions& options);

struct TextCurveOptions {
  int columns = 60;  // characters of the plot area (2 points across each, braille)
  int rows = 8;      // lines of the plot area (4 points down each)
  std::string label = "loss";
};

// `points` as a line of braille dots with the highest and lowest values marked on the left and
// the first and last steps below, lines joined by '\n' (none after the last); non-finite values
// are left out. "" for fewer than 3 points.
std::string text_curve(const std::vector<StepValue>& points, const TextCurveOptions& options = {});

}  // namespace shardtrain::train
