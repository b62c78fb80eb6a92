// JSONL metrics sink.
#include "train/metrics.h"

#include "core/error.h"

namespace shardtrain::train {

JsonlSink::JsonlSink(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  ST_CHECK(file_ != nullptr, "cannot create metrics file `", path, "` (`logging.metrics_file`)");
}

JsonlSink::~JsonlSink() {
  if (file_) std::fclose(file_);
}

void JsonlSink::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  ST_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
           "writing metrics file `", path_, "` failed (disk full?)");
}

}  // namespace shardtrain::train
