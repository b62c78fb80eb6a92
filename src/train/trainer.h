// The training loop: data, model, optimizer, schedule, evaluation, logs and metrics, and
// a sample at the end. One process, one rank (sharded runs build on the same loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "train/config.h"

namespace shardtrain::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;       // mean over the step's counted tokens
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_second = 0;
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  std::vector<std::pair<int64_t, double>> evals;  // (step, held-out loss)
  double seconds = 0;
  double tokens_per_second = 0;  // over the whole run, evaluation excluded
  std::string sample;
};

class Trainer {
 public:
  // Loads the data and builds the model and optimizer; nothing is trained yet.
  explicit Trainer(const JobConfig& config);
  ~Trainer();

  TrainSummary run();

  model::Llama& model() { return *model_; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Mean held-out loss over eval.batches batches (or fewer if the split is small).
  double evaluate();

 private:
  JobConfig config_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  data::TokenStreams streams_;
  std::unique_ptr<data::WindowSampler> sampler_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
};

// Builds the model shape from the `model` section and the tokenizer's vocabulary.
model::LlamaConfig llama_config(const ModelSection& section, int64_t tokenizer_vocab);

}  // namespace shardtrain::train
