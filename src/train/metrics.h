// Machine-readable metrics, separate from the human log: one JSON object per line, and
// TensorBoard event files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace shardtrain::train {

class JsonlSink {
 public:
  JsonlSink() = default;
  // Opens `path`; "" gives a sink that drops everything. A run that starts at step 1
  // truncates it; a resumed run (first_step > 1) keeps the records of steps before
  // first_step, which the checkpoint it resumed from covers, drops the later ones (the
  // previous run went past its last checkpoint; this run repeats those steps), and appends.
  explicit JsonlSink(const std::string& path, int64_t first_step = 1);
  ~JsonlSink();
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;

  void write(const nlohmann::json& record);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// TensorBoard's event files (what `tensorboard --logdir` reads): TFRecord framing (length,
// masked CRC-32C of it, an Event protocol buffer, its masked CRC-32C), written by hand so no
// protobuf library is needed. Each record's numeric fields become scalars tagged by their
// names at the record's "step". A resumed run (first_step > 1) starts its file with a
// SessionLog START at first_step, which makes TensorBoard drop the steps from first_step on
// that earlier files hold.
class TensorBoardSink {
 public:
  TensorBoardSink() = default;
  // Creates `dir` and a new file in it, events.out.tfevents.<seconds>.<host>.<pid>; "" gives a
  // sink that drops everything.
  TensorBoardSink(const std::string& dir, int64_t first_step);
  ~TensorBoardSink();
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;

  void write(const nlohmann::json& record);  // flushed
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::FILE* file_ = nullptr;
  std::string path_;
};

// CRC-32C (Castagnoli), as TFRecord frames use it (exposed for tests).
uint32_t crc32c(const void* data, size_t size);

}  // namespace shardtrain::train
