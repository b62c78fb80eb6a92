// safetensors writing with atomic renames.
#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/checksum.h"
#include "io/safetensors.h"

namespace shardtrain::io {
namespace {

const char* file_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
  }
  return "?";
}

std::atomic<uint64_t> g_bytes_written{0};
std::atomic<int64_t> g_last_write_ns{std::chrono::steady_clock::now().time_since_epoch().count()};

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  constexpr size_t kPiece = size_t{64} << 20;  // a piece at a time, so that progress shows during a large tensor
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min(n, kPiece));
    if (w < 0 && errno == EINTR) continue;
    ST_CHECK(w > 0, "writing `", path, "` failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
    g_last_write_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    g_bytes_written.fetch_add(static_cast<uint64_t>(w), std::memory_order_release);
  }
}

void fsync_folder(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes chunks to `<path>.tmp.<pid>`, fsyncs, renames to `path`.
template <typename WriteBody>
void atomic_write(const std::string& path, WriteBody&& body) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ST_CHECK(fd >= 0, "cannot create `", tmp, "`: ", std::strerror(errno));
  try {
    body(fd, tmp);
    ST_CHECK(::fsync(fd) == 0, "fsync of `", tmp, "` failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  ::close(fd);
  ST_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "renaming `", tmp, "` to `", path, "` failed: ",
           std::strerror(errno));
  fsync_folder(path);
}

}  // namespace

WriteActivity write_activity() {
  WriteActivity a;
  a.bytes = g_bytes_written.load(std::memory_order_acquire);
  const auto last = std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(g_last_write_ns.load(std::memory_order_relaxed)));
  a.seconds_ago = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
  return a;
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  atomic_write(path, [&](int fd, const std::string& tmp) { write_all(fd, contents.data(), contents.size(), tmp); });
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta = {{"format", "pt"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  // every tensor's checksum, from the bytes about to be written (all threads for a large one)
  nlohmann::ordered_json sums = nlohmann::ordered_json::object();
  for (const auto& [name, t] : tensors)
    if (t.device().is_cpu() && t.is_contiguous()) sums[name] = format_crc32c(crc32c_parallel(t.raw_data(), t.nbytes()));
  meta[kChecksumMetadataKey] = sums.dump();
  header["__metadata__"] = meta;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ST_CHECK(t.device().is_cpu() && t.is_contiguous(), "writing `", path, "`: tensor `", name,
             "` must be a contiguous host tensor, found ", t.str());
    ST_CHECK(name != "__metadata__" && !header.contains(name), "writing `", path, "`: duplicate or reserved name `",
             name, "`");
    std::vector<int64_t> shape;
    for (int i = 0; i < t.ndim(); ++i) shape.push_back(t.size(i));
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", file_dtype(t.dtype())}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts on an 8-byte boundary
  atomic_write(path, [&](int fd, const std::string& tmp) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);
    write_all(fd, len, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    for (const auto& [name, t] : tensors) write_all(fd, t.raw_data(), t.nbytes(), tmp);
  });
}

ShardedWriter::ShardedWriter(std::string folder, int64_t max_shard_bytes)
    : folder_(std::move(folder)), max_shard_bytes_(max_shard_bytes) {
  ST_CHECK(max_shard_bytes_ > 0, "shard size limit must be positive, found ", max_shard_bytes_);
  std::filesystem::create_directories(folder_);
}

ShardedWriter::~ShardedWriter() {
  if (finished_) return;
  std::error_code ec;
  for (const std::string& f : temp_files_) std::filesystem::remove(f, ec);
}

void ShardedWriter::add(const std::string& name, const Tensor& tensor) {
  ST_CHECK(!finished_, "ShardedWriter: add after finish");
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (!pending_.empty() && pending_bytes_ + bytes > max_shard_bytes_) flush();
  Tensor copy = Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu(), "export buffer");
  if (bytes > 0) std::memcpy(copy.raw_data(), tensor.raw_data(), tensor.nbytes());
  pending_.emplace_back(name, copy);
  pending_bytes_ += bytes;
  total_bytes_ += bytes;
}

void ShardedWriter::flush() {
  if (pending_.empty()) return;
  const std::string tmp = (std::filesystem::path(folder_) /
                           ("shard-" + std::to_string(temp_files_.size()) + ".partial.safetensors"))
                              .string();
  write_safetensors(tmp, pending_);
  temp_files_.push_back(tmp);
  std::vector<std::string> names;
  for (const auto& [n, t] : pending_) names.push_back(n);
  shard_tensors_.push_back(std::move(names));
  pending_.clear();
  pending_bytes_ = 0;
}

void ShardedWriter::finish() {
  ST_CHECK(!finished_, "ShardedWriter: finish called twice");
  flush();
  finished_ = true;
  namespace fs = std::filesystem;
  const size_t n = temp_files_.size();
  if (n == 1) {
    fs::rename(temp_files_[0], fs::path(folder_) / "model.safetensors");
    fsync_folder((fs::path(folder_) / "model.safetensors").string());
    return;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_bytes_}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    fs::rename(temp_files_[i], fs::path(folder_) / name);
    for (const std::string& t : shard_tensors_[i]) map[t] = name;
  }
  index["weight_map"] = map;
  write_file_atomic((fs::path(folder_) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace shardtrain::io
