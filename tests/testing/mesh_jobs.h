// A small training job and its corpus for the trainer on CPU meshes under mpirun (tensor
// parallelism, replicas): heads, kv heads and FFN width that divide by 2 and 3, units padded
// on every mesh, clipping exercised.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train/config.h"

namespace shardtrain::testing {

// A text corpus of 300 short documents, one file per rank and process (`tag` names it).
inline std::string mesh_corpus_file(const std::string& tag, int rank) {
  const std::string name =
      "shardtrain_" + tag + "_corpus_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".txt";
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream out(path);
  for (int i = 0; i < 300; ++i)
    out << "Document " << i << " is split over a mesh of ranks: heads, columns, rows and replicas, number "
        << i * 7 % 13 << ".\n\n";
  return path;
}

// 12 steps of 2 micro-batches of `batch_size` sequences of 24 tokens, on `tp` x replicas.
inline train::JobConfig mesh_job(const std::string& corpus, int64_t batch_size, int tp, int replicate = 1) {
  train::LoadedConfig c = train::load_config(
      "", {"--model.dim=48", "--model.n_layers=2", "--model.n_heads=6",
           "--model.n_kv_heads=" + std::to_string(tp == 3 ? 3 : 2), "--model.ffn_dim=54", "--model.max_seq_len=32",
           "--model.tie_embeddings=false", "--training.seq_len=24", "--training.device=cpu",
           "--training.batch_size=" + std::to_string(batch_size), "--training.grad_accum_steps=2",
           "--training.steps=12", "--training.max_grad_norm=0.5", "--schedule.warmup_steps=3", "--optimizer.lr=3e-3",
           "--eval.interval_steps=0", "--eval.batches=2", "--sample.tokens=0", "--logging.progress=off",
           "--logging.level=warn", "--logging.metrics_file=", "--data.source=" + corpus, "--data.val_fraction=0.1",
           "--run.output_dir=" + std::filesystem::temp_directory_path().string() + "/shardtrain_mesh_run",
           "--parallel.tensor_parallel=" + std::to_string(tp), "--parallel.replicate=" + std::to_string(replicate)});
  return c.config;
}

}  // namespace shardtrain::testing
