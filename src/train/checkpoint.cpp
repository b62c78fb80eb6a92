// Checkpoints: per-rank pieces of f32 master weights and AdamW state, tagged by parameter
// and element range of the whole parameter, so that any mesh can read them back.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif
#include "core/allocator.h"
#include "core/build_info.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "ops/elementwise.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "shardtrain-checkpoint";
// Version 2 adds strided pieces (a tensor-parallel part's columns); a checkpoint without them
// is written as version 1, which earlier builds read.
constexpr int kVersion = 1, kStridedVersion = 2;
constexpr const char* kMaster = "master";
constexpr const char* kExpAvg = "exp_avg";
constexpr const char* kExpAvgSq = "exp_avg_sq";

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08}", step); }
std::string rank_file_name(int rank, int world) { return fmt::format("rank_{:05}-of-{:05}.safetensors", rank, world); }
std::string piece_name(const std::string& param, const char* kind, int64_t first, int64_t end) {
  return fmt::format("{}|{}|{}:{}", param, kind, first, end);
}
// A strided piece [rows, end - first]: row i holds elements [first + i·stride, end + i·stride).
std::string strided_piece_name(const std::string& param, const char* kind, int64_t first, int64_t end,
                               int64_t stride) {
  return fmt::format("{}|{}|{}:{}/{}", param, kind, first, end, stride);
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The part of parameter `spec` (elements [first, first + count) of its part on this rank)
// that lies in this rank's slice of unit `unit`, at `shard_offset` inside the shard.
struct LocalRange {
  size_t unit;
  const model::ParamSpec* spec;
  int64_t first, count, shard_offset;
};

std::vector<LocalRange> local_ranges(const model::ModelLayout& layout, int rank) {
  std::vector<LocalRange> out;
  for (size_t u = 0; u < layout.units().size(); ++u)
    for (const model::ShardRange& r : model::shard_ranges(layout.units()[u], layout.shard_index(u, rank)))
      out.push_back({u, r.spec, r.first, r.count, r.shard_offset});
  return out;
}

// A local range as pieces of the whole parameter: (first, end, stride, rows, offset in the
// range). One contiguous piece, or for a part made of columns: a partial first row, the full
// rows between as one strided piece, a partial last row.
struct PieceShape {
  int64_t first, end, stride, rows, local_offset;
};
std::vector<PieceShape> piece_shapes(const model::ParamSpec& p, int64_t first, int64_t count) {
  std::vector<PieceShape> out;
  if (p.split_dim != 1) {
    model::for_each_run(p, first, count, [&](int64_t full_first, int64_t local_first, int64_t n) {
      out.push_back({full_first, full_first + n, 0, 1, local_first - first});
    });
    return out;
  }
  const int64_t cols = p.shape[1], full_cols = p.full_shape[1];
  model::for_each_run(p, first, count, [&](int64_t full_first, int64_t local_first, int64_t n) {
    // a full row extends a piece of full rows that ends just above it
    if (!out.empty() && n == cols && out.back().end - out.back().first == cols &&
        full_first == out.back().first + out.back().rows * full_cols) {
      ++out.back().rows;
      out.back().stride = full_cols;
      return;
    }
    out.push_back({full_first, full_first + n, 0, 1, local_first - first});
  });
  return out;
}

// Elements [first + i·stride, end + i·stride) for i in [0, rows) of a parameter.
struct PieceRef {
  int64_t first, end, stride = 0, rows = 1;
  size_t file;
  std::string tensor;
};

// Every piece of every rank file, by (parameter, kind), sorted by first element.
class PieceIndex {
 public:
  PieceIndex(const CheckpointInfo& info, const std::vector<std::string>& files) : dir_(info.path) {
    for (const std::string& f : files) {
      const fs::path path = fs::path(info.path) / f;
      ST_CHECK(fs::exists(path), "checkpoint `", info.path, "`: rank file `", f, "` listed in metadata.json is missing");
      files_.push_back(std::make_unique<io::SafetensorsFile>(path.string()));
      for (const io::TensorInfo& t : files_.back()->tensors()) {
        const size_t bar1 = t.name.find('|'), bar2 = t.name.find('|', bar1 + 1);
        const size_t colon = bar2 == std::string::npos ? std::string::npos : t.name.find(':', bar2);
        const size_t slash = colon == std::string::npos ? std::string::npos : t.name.find('/', colon);
        ST_CHECK(bar1 != std::string::npos && bar2 != std::string::npos && colon != std::string::npos,
                 "checkpoint file `", path.string(), "`: tensor `", t.name,
                 "` is not named <parameter>|<kind>|<first>:<end>[/<stride>]");
        PieceRef r;
        try {
          r.first = std::stoll(t.name.substr(bar2 + 1, colon - bar2 - 1));
          const size_t end_chars = slash == std::string::npos ? std::string::npos : slash - colon - 1;
          r.end = std::stoll(t.name.substr(colon + 1, end_chars));
          if (slash != std::string::npos) r.stride = std::stoll(t.name.substr(slash + 1));
        } catch (const std::exception&) {
          ST_THROW("checkpoint file `", path.string(), "`: tensor `", t.name,
                   "` is not named <parameter>|<kind>|<first>:<end>[/<stride>] with integers");
        }
        r.file = files_.size() - 1;
        r.tensor = t.name;
        int64_t numel = 1;
        for (int64_t d : t.shape) numel *= d;
        const int64_t width = r.end - r.first;
        ST_CHECK(r.first >= 0 && width > 0, "checkpoint file `", path.string(), "`: piece `", t.name,
                 "` names an empty or negative range");
        if (slash == std::string::npos) {
          ST_CHECK(numel == width, "checkpoint file `", path.string(), "`: piece `", t.name, "` holds ", numel,
                   " elements, its name says ", width);
        } else {
          ST_CHECK(t.shape.size() == 2 && t.shape[1] == width && r.stride >= width, "checkpoint file `",
                   path.string(), "`: strided piece `", t.name, "` has shape ",
                   Shape(t.shape.begin(), t.shape.end()).str(), "; expected [rows, ", width,
                   "] with a stride of at least ", width);
          r.rows = t.shape[0];
        }
        index_[{t.name.substr(0, bar1), t.name.substr(bar1 + 1, bar2 - bar1 - 1)}].push_back(r);
      }
    }
    for (auto& [key, refs] : index_)
      std::sort(refs.begin(), refs.end(), [](const PieceRef& a, const PieceRef& b) { return a.first < b.first; });
  }

  // "" when the pieces of parameter `name`'s `kind` hold each of its `numel` elements exactly
  // once, else the first element missing or held twice (every row of a strided piece is a run).
  std::string coverage(const std::string& name, const std::string& kind, int64_t numel) const {
    const auto it = index_.find({name, kind});
    if (it == index_.end()) return "no pieces";
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (const PieceRef& r : it->second)
      for (int64_t i = 0; i < r.rows; ++i) runs.emplace_back(r.first + i * r.stride, r.end + i * r.stride);
    std::sort(runs.begin(), runs.end());
    int64_t next = 0;
    for (const auto& [a, b] : runs) {
      if (a > next) return fmt::format("elements [{}, {}) missing", next, a);
      if (a < next) return fmt::format("element {} held twice", a);
      next = b;
    }
    if (next < numel) return fmt::format("elements [{}, {}) missing", next, numel);
    if (next > numel) return fmt::format("pieces run to element {}, past its {}", next, numel);
    return "";
  }
  size_t pieces() const {
    size_t n = 0;
    for (const auto& [key, refs] : index_) n += refs.size();
    return n;
  }
  // Pieces of parameters `known` does not name.
  std::vector<std::string> unknown(const std::function<bool(const std::string&)>& known) const {
    std::vector<std::string> out;
    for (const auto& [key, refs] : index_)
      if (!known(key.first)) out.push_back(key.first + "|" + key.second);
    return out;
  }

  bool has_kind(const std::string& kind) const {
    for (const auto& [key, refs] : index_)
      if (key.second == kind) return true;
    return false;
  }

  // Elements [first, first + out.numel()) of the whole parameter `p.name`'s `kind` into the
  // host tensor `out`.
  void read(const model::ParamSpec& p, const std::string& kind, int64_t first, Tensor& out) const {
    const auto it = index_.find({p.name, kind});
    ST_CHECK(it != index_.end(), "checkpoint `", dir_, "`: no ", kind, " pieces of parameter `", p.name,
             "` (a checkpoint of a different model?)");
    const int64_t end = first + out.numel();
    int64_t covered = 0;
    for (const PieceRef& r : it->second) {
      const int64_t width = r.end - r.first, last = r.first + (r.rows - 1) * r.stride + width;
      ST_CHECK(last <= p.full_numel(), "checkpoint `", dir_, "`: piece `", r.tensor, "` runs past the ",
               p.full_numel(), " elements of `", p.name, "` ", p.full_shape.str(),
               " (a checkpoint of a different model shape?)");
      if (last <= first || r.first >= end) continue;
      // the rows whose run meets [first, end)
      const int64_t row_lo = r.rows == 1 ? 0 : std::max<int64_t>(0, floor_div(first - width - r.first, r.stride) + 1);
      const int64_t row_hi = r.rows == 1 ? 0 : std::min(r.rows - 1, floor_div(end - 1 - r.first, r.stride));
      for (int64_t i = row_lo; i <= row_hi; ++i) {
        const int64_t s = r.first + i * r.stride, a = std::max(first, s), b = std::min(end, s + width);
        if (a >= b) continue;
        Tensor dst = out.flat_range(a - first, b - a);
        files_[r.file]->read_range(r.tensor, i * width + (a - s), dst);
        covered += b - a;
      }
    }
    ST_CHECK(covered == end - first, "checkpoint `", dir_, "`: elements [", first, ", ", end, ") of ", kind, " `",
             p.name, "` are not all present (", covered, " found)");
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::map<std::pair<std::string, std::string>, std::vector<PieceRef>> index_;
};

// Fills `shards` (this rank's, per unit; any device) from the pieces of `kind`.
void fill_shards(std::vector<Tensor>& shards, const model::ModelLayout& layout, int rank, const PieceIndex& index,
                 const char* kind) {
  for (const LocalRange& r : local_ranges(layout, rank)) {
    Tensor staged = Tensor::empty({r.count}, DType::kF32, Device::cpu(), "checkpoint staging");
    model::for_each_run(*r.spec, r.first, r.count, [&](int64_t full_first, int64_t local_first, int64_t n) {
      Tensor run = staged.flat_range(local_first - r.first, n);
      index.read(*r.spec, kind, full_first, run);
    });
    Tensor dst = shards[r.unit].flat_range(r.shard_offset, r.count);
    ops::cast(dst, staged);
  }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  ST_CHECK(in.good(), "cannot open `", path, "`");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    ST_THROW("`", path, "` is not valid JSON: ", e.what());
  }
}

}  // namespace

std::unique_ptr<PendingCheckpoint> begin_checkpoint(const std::string& root, int64_t step,
                                                    const model::LlamaConfig& config,
                                                    const std::string& tokenizer_source,
                                                    fsdp::ShardedUnitStore& store, optim::AdamW* optimizer,
                                                    dist::Communicator& comm, int keep, CheckpointStaging* staging,
                                                    bool snapshot, const std::string& config_text) {
  auto c = std::unique_ptr<PendingCheckpoint>(new PendingCheckpoint());
  c->root_ = root;
  c->config_text_ = config_text;
  c->step_ = step;
  c->keep_ = keep;
  c->rank_ = comm.rank();
  c->world_ = comm.world_size();
  const fs::path tmp_dir = fs::path(root) / fmt::format(".{}.tmp", step_dir_name(step));
  c->file_ = (tmp_dir / rank_file_name(c->rank_, c->world_)).string();
  if (c->rank_ == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
  }
  comm.barrier();

  bool strided = false;
  // whole shards copied to the host once each (one transfer), the pieces views of them
  std::map<std::pair<int, int>, Tensor> copies;
  auto host_copy = [&](int unit, int kind, const Tensor& shard) -> Tensor {
    if (!snapshot && shard.device().is_cpu() && shard.dtype() == DType::kF32) return shard;  // written as it is
    const auto key = std::make_pair(unit, kind);
    if (const auto it = copies.find(key); it != copies.end()) return it->second;
    Tensor host = staging != nullptr ? staging->buffer(unit, kind, shard.numel(), !shard.device().is_cpu())
                                     : Tensor::empty({shard.numel()}, DType::kF32, Device::cpu(), "checkpoint copy");
    if (shard.dtype() == DType::kF32) copy(host, shard);
    else ops::cast(host, shard);  // f64 masters of a CPU check run
    return copies[key] = host;
  };
  // the first replica saves the shards (every replica holds the same); the others' files are empty
  const std::vector<LocalRange> ranges = store.layout().mesh().replica(c->rank_) == 0
                                             ? local_ranges(store.layout(), c->rank_)
                                             : std::vector<LocalRange>();
  for (const LocalRange& r : ranges) {
    // a parameter every rank of a tensor-parallel group holds is saved by the group's rank 0
    if (r.spec->replicated && store.layout().tp_rank() != 0) continue;
    for (const PieceShape& ps : piece_shapes(*r.spec, r.first, r.count)) {
      const int64_t width = ps.end - ps.first;
      auto add = [&](const char* kind, int kind_index, const Tensor& shard) {
        const Shape shape = ps.rows == 1 ? Shape{width} : Shape{ps.rows, width};
        const Tensor host = host_copy(static_cast<int>(r.unit), kind_index, shard);
        c->pieces_.emplace_back(ps.rows == 1 ? piece_name(r.spec->name, kind, ps.first, ps.end)
                                             : strided_piece_name(r.spec->name, kind, ps.first, ps.end, ps.stride),
                                host.flat_range(r.shard_offset + ps.local_offset, ps.rows * width).view(shape));
      };
      strided |= ps.rows > 1;
      add(kMaster, 0, store.master_shards()[r.unit]);
      if (optimizer != nullptr) {
        add(kExpAvg, 1, optimizer->exp_avg()[r.unit]);
        add(kExpAvgSq, 2, optimizer->exp_avg_sq()[r.unit]);
      }
    }
  }

  // the version: strided pieces on any rank need version 2
  Tensor any_strided = Tensor::empty({1}, DType::kI64, Device::cpu(), "strided pieces");
  any_strided.data<int64_t>()[0] = strided ? 1 : 0;
  comm.all_reduce(any_strided, dist::ReduceOp::kSum);

  json meta;
  meta["format"] = kFormat;
  meta["version"] = any_strided.data<int64_t>()[0] > 0 ? kStridedVersion : kVersion;
  meta["step"] = step;
  meta["world_size"] = c->world_;
  meta["tensor_parallel"] = store.layout().mesh().tensor_parallel;
  meta["config"] = model::to_hf_config(config, "float32");
  meta["tokenizer_source"] = tokenizer_source;
  meta["optimizer_steps"] = optimizer != nullptr ? optimizer->steps_taken() : 0;
  meta["has_optimizer_state"] = optimizer != nullptr;
  meta["written_by"] = std::string("shardtrain ") + build_commit();
  json files = json::array();
  for (int r = 0; r < c->world_; ++r) files.push_back(rank_file_name(r, c->world_));
  meta["files"] = files;
  c->metadata_ = meta.dump(2) + "\n";
  for (const auto& [name, t] : c->pieces_) c->bytes_ += static_cast<int64_t>(t.nbytes());
  return c;
}

void PendingCheckpoint::write() {
  io::write_safetensors(file_, pieces_, {{"shardtrain", "checkpoint pieces"}, {"rank", std::to_string(rank_)}});
  pieces_.clear();  // on disk now (and host copies of our own freed)
}

Tensor CheckpointStaging::buffer(int unit, int kind, int64_t numel, bool page_locked) {
  const auto key = std::make_pair(unit, kind);
  if (const auto it = buffers_.find(key); it != buffers_.end()) {
    ST_ASSERT(it->second.numel() == numel, "checkpoint staging: a shard changed size");
    return it->second;
  }
  Tensor t;
#ifdef SHARDTRAIN_WITH_CUDA
  if (page_locked) {
    auto pinned = std::make_shared<cuda::PinnedBuffer>(std::max<size_t>(static_cast<size_t>(numel) * 4, 64),
                                                       "checkpoint staging");
    owners_.push_back(pinned);
    t = Tensor::from_blob(pinned->data(), {numel}, DType::kF32, Device::cpu());
  }
#else
  (void)page_locked;
#endif
  if (!t.defined()) t = Tensor::empty({numel}, DType::kF32, Device::cpu(), "checkpoint staging");
  return buffers_[key] = t;
}

std::string PendingCheckpoint::commit(dist::Communicator& comm, std::exception_ptr write_error) {
  // every rank says whether its file was written, so that a failed rank does not leave the
  // others waiting, and no rank publishes a checkpoint with a missing file
  Tensor ok = Tensor::empty({1}, DType::kI64, Device::cpu(), "checkpoint written");
  ok.data<int64_t>()[0] = write_error ? 0 : 1;
  comm.all_reduce(ok, dist::ReduceOp::kSum);
  const fs::path final_dir = fs::path(root_) / step_dir_name(step_);
  const fs::path tmp_dir = fs::path(root_) / fmt::format(".{}.tmp", step_dir_name(step_));
  if (ok.data<int64_t>()[0] != world_) {
    // every rank is done writing (the sum above): the files that were written go, not to be
    // left for a step that may never be saved again
    if (rank_ == 0) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
    std::string mine;
    if (write_error) {
      try {
        std::rethrow_exception(write_error);
      } catch (const std::exception& e) {
        mine = std::string(" (this rank: ") + e.what() + ")";
      }
    }
    ST_THROW("checkpoint of step ", step_, ": ", world_ - ok.data<int64_t>()[0], " of ", world_,
             " ranks failed to write their file under `", tmp_dir.string(), "`; `latest` still names the previous "
             "checkpoint", mine);
  }
  if (rank_ == 0) {
    try {
      if (!config_text_.empty()) io::write_file_atomic((tmp_dir / "config.toml").string(), config_text_);
      io::write_file_atomic((tmp_dir / "metadata.json").string(), metadata_);
      fsync_path(tmp_dir);
      fs::remove_all(final_dir);  // a re-save of the same step replaces it
      fs::rename(tmp_dir, final_dir);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);  // a partial checkpoint is not left behind
      throw;
    }
    fsync_path(root_);
    io::write_file_atomic((fs::path(root_) / "latest").string(), step_dir_name(step_) + "\n");
    if (keep_ > 0) {
      std::vector<fs::path> steps;
      for (const fs::directory_entry& e : fs::directory_iterator(root_))
        if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path());
      std::sort(steps.begin(), steps.end());
      for (size_t i = 0; i + static_cast<size_t>(keep_) < steps.size(); ++i)
        if (steps[i] != final_dir) fs::remove_all(steps[i]);
    }
  }
  comm.barrier();
  return final_dir.string();
}

std::string save_checkpoint(const std::string& root, int64_t step, const model::LlamaConfig& config,
                            const std::string& tokenizer_source, fsdp::ShardedUnitStore& store,
                            optim::AdamW* optimizer, dist::Communicator& comm, int keep,
                            CheckpointStaging* staging, const std::string& config_text) {
  const std::unique_ptr<PendingCheckpoint> c = begin_checkpoint(root, step, config, tokenizer_source, store, optimizer,
                                                                comm, keep, staging, false, config_text);
  std::exception_ptr write_error;
  try {
    c->write();
  } catch (...) {
    write_error = std::current_exception();
  }
  return c->commit(comm, write_error);
}

std::string resolve_checkpoint(const std::string& spec, const std::string& root) {
  if (spec != "auto") return spec;
  const fs::path latest = fs::path(root) / "latest";
  if (!fs::exists(latest)) return "";
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  ST_CHECK(!name.empty() && fs::is_directory(fs::path(root) / name), "`", latest.string(), "` names `", name,
           "`, which is not a checkpoint directory under ", root);
  return (fs::path(root) / name).string();
}

// The metadata's fields, each checked for type and range and against the directory's name and
// files, before anything is read: a field out of range would otherwise surface as negative
// steps, a learning rate below zero or a save over the checkpoint it came from.
CheckpointInfo read_checkpoint_info(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "metadata.json").string();
  ST_CHECK(fs::is_directory(step_dir), "checkpoint `", step_dir, "` is not a directory");
  const json meta = read_json(path);
  ST_CHECK(meta.is_object() && meta.value("format", "") == kFormat, "`", path, "` is not a shardtrain checkpoint");
  constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  auto field = [&](const char* key) -> const json& {
    ST_CHECK(meta.contains(key), "`", path, "`: field `", key, "` is missing");
    return meta.at(key);
  };
  // an integer field in [lo, hi]
  auto integer = [&](const char* key, int64_t lo, int64_t hi, const std::string& expected) -> int64_t {
    const json& v = field(key);
    ST_CHECK(v.is_number_integer(), "`", path, "`: field `", key, "` must be ", expected, ", found ", v.dump());
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxInt)
                          ? kMaxInt
                          : v.get<int64_t>();
    ST_CHECK(x >= lo && x <= hi, "`", path, "`: field `", key, "` must be ", expected, ", found ", v.dump());
    return x;
  };
  const int64_t version = integer("version", 0, kMaxInt, "a format version");
  ST_CHECK(version == kVersion || version == kStridedVersion, "`", path, "`: checkpoint format version ", version,
           ", this build reads versions ", kVersion, " and ", kStridedVersion);
  CheckpointInfo info;
  info.path = step_dir;
  info.step = integer("step", 0, kMaxInt, "an integer >= 0 (the optimizer steps completed)");
  const fs::path normal = fs::path(step_dir).lexically_normal();
  const std::string dir_name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  if (dir_name.rfind("step_", 0) == 0 && dir_name.size() > 5 &&
      dir_name.find_first_not_of("0123456789", 5) == std::string::npos)
    ST_CHECK(dir_name == step_dir_name(info.step), "`", path, "`: field `step` = ", info.step,
             " disagrees with the directory's name `", dir_name, "` (expected `", step_dir_name(info.step), "`)");
  info.world_size = static_cast<int>(integer("world_size", 1, 1 << 20, "an integer >= 1 (the ranks that wrote it)"));
  if (meta.contains("tensor_parallel")) {
    const int64_t tp = integer("tensor_parallel", 1, info.world_size, fmt::format("an integer in [1, world_size = {}]",
                                                                                  info.world_size));
    ST_CHECK(info.world_size % tp == 0, "`", path, "`: field `tensor_parallel` = ", tp,
             " does not divide field `world_size` = ", info.world_size);
  }
  const json& has_state = field("has_optimizer_state");
  ST_CHECK(has_state.is_boolean(), "`", path, "`: field `has_optimizer_state` must be true or false, found ",
           has_state.dump());
  const int64_t optimizer_steps = integer("optimizer_steps", 0, info.step,
                                          fmt::format("an integer in [0, step = {}]", info.step));
  ST_CHECK(has_state.get<bool>() || optimizer_steps == 0, "`", path, "`: field `optimizer_steps` = ", optimizer_steps,
           " with `has_optimizer_state` = false; expected 0");
  const json& tokenizer = meta.contains("tokenizer_source") ? meta.at("tokenizer_source") : json("");
  ST_CHECK(tokenizer.is_string(), "`", path, "`: field `tokenizer_source` must be a string (a folder, or \"\" for the "
           "built-in tokenizer), found ", tokenizer.dump());
  info.tokenizer_source = tokenizer.get<std::string>();
  if (meta.contains("written_by"))
    ST_CHECK(meta.at("written_by").is_string(), "`", path, "`: field `written_by` must be a string, found ",
             meta.at("written_by").dump());
  const json& files = field("files");
  ST_CHECK(files.is_array() && files.size() == static_cast<size_t>(info.world_size), "`", path,
           "`: field `files` must list one rank file for each of the ", info.world_size,
           " ranks (field `world_size`), found ", files.is_array() ? std::to_string(files.size()) + " entries" : files.dump());
  for (int r = 0; r < info.world_size; ++r) {
    const std::string expected = rank_file_name(r, info.world_size);
    ST_CHECK(files[r].is_string() && files[r].get<std::string>() == expected, "`", path, "`: field `files`[", r,
             "] must be \"", expected, "\", found ", files[r].dump());
    const fs::path file = fs::path(step_dir) / expected;
    ST_CHECK(fs::is_regular_file(file), "checkpoint `", step_dir, "`: rank file `", expected,
             "` listed in metadata.json is missing", fs::exists(file) ? " (not a regular file)" : "");
  }
  info.config = model::parse_hf_config(field("config"), path + " field `config`");
  return info;
}

CheckpointReport checkpoint_report(const std::string& step_dir) {
  const CheckpointInfo info = read_checkpoint_info(step_dir);
  const json meta = read_json((fs::path(info.path) / "metadata.json").string());
  const std::vector<std::string> files = meta.at("files").get<std::vector<std::string>>();
  const PieceIndex index(info, files);
  std::ostringstream r;
  r << fmt::format("{}  (shardtrain checkpoint, format version {})\n", info.path, meta.value("version", 0));
  r << fmt::format("  step {}, written by {} rank{}{}; optimizer state: {}\n", info.step, info.world_size,
                   info.world_size == 1 ? "" : "s",
                   meta.value("tensor_parallel", 1) > 1 ? fmt::format(" (tensor parallel {})", meta.value("tensor_parallel", 1))
                                                        : std::string(),
                   meta.value("has_optimizer_state", false)
                       ? fmt::format("AdamW moments after {} steps", meta.value("optimizer_steps", int64_t{0}))
                       : std::string("none"));
  if (meta.contains("written_by")) r << "  saved by " << meta.value("written_by", std::string()) << "\n";
  r << "  model: " << info.config.summary() << "\n";
  r << "  tokenizer: " << (info.tokenizer_source.empty() ? std::string("built in (byte-level)") : info.tokenizer_source)
    << "\n";
  int64_t bytes = 0;
  for (const std::string& f : files) {
    const auto size = static_cast<int64_t>(fs::file_size(fs::path(info.path) / f));
    bytes += size;
    r << fmt::format("  {}  {}\n", f, format_bytes(size));
  }
  r << fmt::format("  {} pieces, {} in all\n", index.pieces(), format_bytes(bytes));
  // every element of every parameter, once per kind the checkpoint holds
  const model::ModelLayout layout = model::ModelLayout::llama(info.config, 1);
  std::vector<const char*> kinds = {kMaster};
  if (meta.value("has_optimizer_state", false)) kinds.insert(kinds.end(), {kExpAvg, kExpAvgSq});
  int problems = 0;
  int64_t params = 0, elements = 0;
  std::map<std::string, bool> names;
  for (const model::UnitLayout& u : layout.units())
    for (const model::ParamSpec& p : u.params) {
      ++params;
      elements += p.full_numel();
      names[p.name] = true;
      for (const char* kind : kinds) {
        const std::string problem = index.coverage(p.name, kind, p.full_numel());
        if (problem.empty()) continue;
        ++problems;
        r << fmt::format("  {} of `{}` {}: {}\n", kind, p.name, p.full_shape.str(), problem);
      }
    }
  for (const std::string& extra : index.unknown([&](const std::string& n) { return names.count(n) > 0; })) {
    ++problems;
    r << "  pieces of a parameter the model does not have: " << extra << "\n";
  }
  std::string what = "master weights";
  if (kinds.size() > 1) what += ", AdamW m and v";
  r << (problems == 0 ? fmt::format("  complete: {} of all {} parameters ({} elements), each element once\n", what,
                                    params, elements)
                      : fmt::format("  INCOMPLETE: {} problem{} (above); this checkpoint cannot be loaded\n", problems,
                                    problems == 1 ? "" : "s"));
  return {r.str(), problems};
}

void load_checkpoint_params(const CheckpointInfo& info, const model::ModelLayout& layout,
                            std::vector<Tensor>& unit_params) {
  ST_ASSERT(unit_params.size() == layout.units().size(), "one buffer per unit");
  const json meta = read_json((fs::path(info.path) / "metadata.json").string());
  const PieceIndex index(info, meta.at("files").get<std::vector<std::string>>());
  for (size_t u = 0; u < layout.units().size(); ++u)
    for (const model::ParamSpec& p : layout.units()[u].params) {
      Tensor dst = unit_params[u].flat_range(p.offset, p.numel());
      const bool f32 = dst.dtype() == DType::kF32;
      Tensor staged = f32 ? dst : Tensor::empty({p.numel()}, DType::kF32, Device::cpu(), "checkpoint staging");
      index.read(p, kMaster, 0, staged);
      if (!f32) ops::cast(dst, staged);
    }
}

void load_checkpoint(const CheckpointInfo& info, fsdp::ShardedUnitStore& store, optim::AdamW* optimizer) {
  const json meta = read_json((fs::path(info.path) / "metadata.json").string());
  const PieceIndex index(info, meta.at("files").get<std::vector<std::string>>());
  store.load([&](const model::ParamSpec& p, int64_t first, Tensor& out) {  // runs of the whole parameter
    Tensor staged = out;
    if (out.dtype() != DType::kF32) staged = Tensor::empty(out.shape(), DType::kF32, Device::cpu(), "checkpoint staging");
    index.read(p, kMaster, first, staged);
    if (out.dtype() != DType::kF32) ops::cast(out, staged);
  });
  if (optimizer == nullptr) return;
  ST_CHECK(meta.value("has_optimizer_state", false) && index.has_kind(kExpAvg), "checkpoint `", info.path,
           "` holds no optimizer state");
  fill_shards(optimizer->exp_avg(), store.layout(), store.rank(), index, kExpAvg);
  fill_shards(optimizer->exp_avg_sq(), store.layout(), store.rank(), index, kExpAvgSq);
  optimizer->set_steps_taken(meta.value("optimizer_steps", int64_t{0}));
}

}  // namespace shardtrain::train
