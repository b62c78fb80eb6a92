// Training checkpoints: a directory CHECKPOINTS/step_00000123/ written atomically (a
// temporary directory, every file fsynced, then renamed; `latest` is updated after), with
//   config.toml                         the job's config (train/config.h config_toml), when given:
//                                       what a resume with checkpoint.resume = auto goes on with
//   metadata.json                       format version, step, the mesh it came from, the
//                                       model config (as HF config.json), the tokenizer
//                                       source, and the piece list of every rank file
//   rank_00000-of-00004.safetensors     that rank's pieces: f32 master weights and AdamW
//                                       state, each named "<param>|<kind>|<first>:<end>"
//                                       (kind: master, exp_avg, exp_avg_sq; elements
//                                       [first, end) of the parameter, row-major)
// Padding is never saved. Any number of ranks loads any checkpoint: each rank reads only
// the pieces that overlap its own shard ranges, whatever mesh wrote them.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/config.h"
#include "optim/adamw.h"

namespace shardtrain::train {

struct CheckpointInfo {
  std::string path;      // the step directory
  int64_t step = 0;      // optimizer steps completed
  int world_size = 0;    // ranks that wrote it
  model::LlamaConfig config;
  // a folder with tokenizer.json, or a tokenizer.json ("" when the tokenizer was built in)
  std::string tokenizer_source;
};

// Host memory the shards are copied into at a save, kept from one save to the next: whole
// shards, one transfer each, page-locked where the shards are on a GPU (so the copy runs at
// the link's speed, not at the pace of pageable memory's first touch).
class CheckpointStaging {
 public:
  // A host f32 buffer of `numel` elements for (unit, kind); the same one at every save.
  Tensor buffer(int unit, int kind, int64_t numel, bool page_locked);

 private:
  std::map<std::pair<int, int>, Tensor> buffers_;
  std::vector<std::shared_ptr<void>> owners_;  // the page-locked memory behind buffers_
};

// A checkpoint being saved in two halves, so that training can go on while the files are
// written (checkpoint.async). begin_checkpoint (collective) copies this rank's shards into
// host memory (`staging`, or buffers of its own) and makes the temporary directory; without
// `snapshot` (the caller writes before the shards change again) f32 shards already in host
// memory are written from where they are; write() writes this rank's file and uses no
// collective, so it may run on another thread while the training thread steps; commit
// (collective) is given what write() threw on this rank (nullptr: the file is written) and
// learns the same from every rank, then rank 0 writes the metadata, renames the directory into
// place, points `latest` at it and deletes all but the newest `keep` step directories (0 keeps
// all). It returns the step directory; if any rank's write failed it throws on every rank
// (naming this rank's error where it had one) and `latest` keeps naming the previous checkpoint.
class PendingCheckpoint {
 public:
  void write();
  std::string commit(dist::Communicator& comm, std::exception_ptr write_error);
  int64_t step() const { return step_; }
  int64_t bytes() const { return bytes_; }  // this rank's pieces

 private:
  friend std::unique_ptr<PendingCheckpoint> begin_checkpoint(const std::string&, int64_t, const model::LlamaConfig&,
                                                             const std::string&, fsdp::ShardedUnitStore&,
                                                             optim::AdamW*, dist::Communicator&, int,
                                                             CheckpointStaging*, bool, const std::string&);
  PendingCheckpoint() = default;
  std::string root_, file_, metadata_, config_text_;
  int64_t step_ = 0, bytes_ = 0;
  int keep_ = 0, rank_ = 0, world_ = 1;
  std::vector<std::pair<std::string, Tensor>> pieces_;  // views of the host copies (holding them), dropped once written
};

std::unique_ptr<PendingCheckpoint> begin_checkpoint(const std::string& root, int64_t step,
                                                    const model::LlamaConfig& config,
                                                    const std::string& tokenizer_source,
                                                    fsdp::ShardedUnitStore& store, optim::AdamW* optimizer,
                                                    dist::Communicator& comm, int keep,
                                                    CheckpointStaging* staging = nullptr, bool snapshot = true,
                                                    const std::string& config_text = "");

// The whole save at once: begin, write, commit (host copies made for this save alone unless
// `staging` keeps them). Returns the step directory.
std::string save_checkpoint(const std::string& root, int64_t step, const model::LlamaConfig& config,
                            const std::string& tokenizer_source, fsdp::ShardedUnitStore& store,
                            optim::AdamW* optimizer, dist::Communicator& comm, int keep,
                            CheckpointStaging* staging = nullptr, const std::string& config_text = "");

// Resolves "auto" (the checkpoint `latest` names under root, or "" when there is none) or
// a step directory, and reads its metadata (throws naming the file on any problem).
std::string resolve_checkpoint(const std::string& spec, const std::string& root);
CheckpointInfo read_checkpoint_info(const std::string& step_dir);

// What `shardtrain inspect` says of a step directory: step, ranks, model, tokenizer, files, and
// whether the pieces hold every element of every parameter once for each kind saved (an
// incomplete checkpoint is named as such), with the number of problems named (0: it loads).
// Throws on unreadable metadata or files.
struct CheckpointReport {
  std::string text;
  int problems = 0;
};
CheckpointReport checkpoint_report(const std::string& step_dir);

// Fills this rank's master shards (and the optimizer's state and step count, when given)
// from the checkpoint's pieces. The store's layout must match the checkpoint's config.
void load_checkpoint(const CheckpointInfo& info, fsdp::ShardedUnitStore& store, optim::AdamW* optimizer);

// The whole model's master weights into `unit_params` (one full buffer [unit.numel] per unit
// of `layout`, on the host, any float dtype; padding untouched), in one process: a model to
// sample from. `layout` must be the checkpoint's config's.
void load_checkpoint_params(const CheckpointInfo& info, const model::ModelLayout& layout,
                            std::vector<Tensor>& unit_params);

}  // namespace shardtrain::train
