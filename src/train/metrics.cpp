// Metrics sinks: JSONL lines, and TensorBoard event files encoded by hand.
#include "train/metrics.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host.h"

namespace shardtrain::train {
namespace fs = std::filesystem;

JsonlSink::JsonlSink(const std::string& path, int64_t first_step) : path_(path) {
  if (path.empty()) return;
  if (first_step > 1 && fs::exists(path)) {
    // keep what the resumed checkpoint covers, in a copy renamed over the file
    std::ifstream in(path);
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() < first_step)
        out << line << '\n';
    }
    out.close();
    ST_CHECK(out.good(), "rewriting metrics file `", path, "` for the resumed run failed (disk full?)");
    std::error_code ec;
    fs::rename(tmp, path, ec);
    ST_CHECK(!ec, "renaming `", tmp, "` to `", path, "`: ", ec.message());
    file_ = std::fopen(path.c_str(), "a");
  } else {
    file_ = std::fopen(path.c_str(), "w");
  }
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

// ---- TensorBoard ----

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

namespace {

uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol-buffer wire format: the few field kinds an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field) << 3 | wire_type); }
template <typename T>
void fixed(std::string& out, int field, T value) {  // wire type 1 (64-bit) or 5 (32-bit)
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, arm64)
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& value) {
  key(out, field, 2);
  varint(out, value.size());
  out += value;
}

// Event {double wall_time = 1; int64 step = 2; oneof {string file_version = 3; Summary summary = 5;
// SessionLog session_log = 7;}}
std::string event(int64_t step) {
  std::string e;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  fixed(e, 1, now);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

TensorBoardSink::TensorBoardSink(const std::string& dir, int64_t first_step) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  ST_CHECK(!ec, "cannot create the TensorBoard folder `", dir, "` (`logging.tensorboard_dir`): ", ec.message());
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}", seconds, host_name(), ::getpid())).string();
  file_ = std::fopen(path_.c_str(), "wb");
  ST_CHECK(file_ != nullptr, "cannot create the TensorBoard event file `", path_, "`");
  std::string first = event(0);
  bytes_field(first, 3, "brain.Event:2");
  write_event(first);
  if (first_step > 1) {
    std::string start = event(first_step);
    std::string session_log;  // SessionLog {SessionStatus status = 1}, START = 1
    key(session_log, 1, 0);
    varint(session_log, 1);
    bytes_field(start, 7, session_log);
    write_event(start);
  }
}

TensorBoardSink::~TensorBoardSink() {
  if (file_) std::fclose(file_);
}

void TensorBoardSink::write_event(const std::string& e) {
  std::string frame;
  const uint64_t length = e.size();
  frame.append(reinterpret_cast<const char*>(&length), 8);
  const uint32_t length_crc = masked_crc(&length, 8);
  frame.append(reinterpret_cast<const char*>(&length_crc), 4);
  frame += e;
  const uint32_t data_crc = masked_crc(e.data(), e.size());
  frame.append(reinterpret_cast<const char*>(&data_crc), 4);
  ST_CHECK(std::fwrite(frame.data(), 1, frame.size(), file_) == frame.size() && std::fflush(file_) == 0,
           "writing the TensorBoard event file `", path_, "` failed (disk full?)");
}

void TensorBoardSink::write(const nlohmann::json& record) {
  if (!file_ || !record.contains("step") || !record["step"].is_number_integer()) return;
  // Summary {repeated Value value = 1}; Value {string tag = 1; float simple_value = 2}
  std::string summary;
  for (const auto& [name, value] : record.items()) {
    if (name == "step" || !value.is_number()) continue;
    std::string v;
    bytes_field(v, 1, name);
    fixed(v, 2, static_cast<float>(value.get<double>()));
    bytes_field(summary, 1, v);
  }
  if (summary.empty()) return;
  std::string e = event(record["step"].get<int64_t>());
  bytes_field(e, 5, summary);
  write_event(e);
}

}  // namespace shardtrain::train
