// Machine-readable metrics: one JSON object per line, separate from the human log.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace shardtrain::train {

class JsonlSink {
 public:
  JsonlSink() = default;
  // Creates (truncates) `path`; "" gives a sink that drops everything.
  explicit JsonlSink(const std::string& path);
  ~JsonlSink();
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;

  void write(const nlohmann::json& record);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace shardtrain::train
