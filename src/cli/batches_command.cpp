// `shardtrain batches`: the token batches a job trains and evaluates on, in one safetensors file,
// for another engine to train on the very same rows (bench/train/convergence.py feeds them to
// PyTorch) or for a user to look at what the model sees.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "data/dataset.h"
#include "io/safetensors_writer.h"
#include "model/hf_config.h"
#include "model/llama.h"
#include "ops/attention.h"
#include "optim/schedule.h"
#include "train/config.h"
#include "train/launch_defaults.h"
#include "train/model_shape.h"
#include "train/training_data.h"

namespace shardtrain::cli {

namespace {

// The steps at which the trainer evaluates: 0 (before the first step) with eval.at_start, every
// eval.interval_steps, and the last.
std::vector<int64_t> eval_steps(const train::JobConfig& c) {
  std::vector<int64_t> steps;
  if (!c.eval.enabled) return steps;
  if (c.eval.at_start) steps.push_back(0);
  for (int64_t s = 1; s <= c.training.steps; ++s)
    if ((c.eval.interval_steps > 0 && s % c.eval.interval_steps == 0) || s == c.training.steps) steps.push_back(s);
  return steps;
}

}  // namespace

int run_batches(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  std::string out;
  int64_t ranks = 1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" || args[i] == "--ranks") {
      ST_CHECK(i + 1 < args.size(), "batches: ", args[i], " needs a value");
      if (args[i] == "--out") {
        out = args[i + 1];
      } else {
        ranks = integer_flag(args[i], args[i + 1], "batches");
        ST_CHECK(ranks >= 1 && ranks <= 65536, "batches: --ranks must be in [1, 65536], found ", ranks);
      }
      ++i;
    } else {
      rest.push_back(args[i]);
    }
  }
  ST_CHECK(!out.empty(), "batches: --out FILE.safetensors is required (where the batches are written)");
  const JobArgs j = parse_job_args(rest, "batches");
  train::JobConfig config = train::load_config(j.config_file, j.overrides).config;
  ST_CHECK(config.parallel.tensor_parallel == 1 && config.parallel.replicate == 1,
           "batches: --ranks counts data-parallel ranks; write the batches of a job with "
           "`parallel.tensor_parallel` = 1 and `parallel.replicate` = 1 (its global batch is the same)");

  const std::unique_ptr<data::Tokenizer> tokenizer = train::make_tokenizer(config.data, config.model.hf);
  model::LlamaConfig mc = config.model.hf.empty()
                             ? train::llama_config(config.model, tokenizer->vocab_size())
                             : model::load_hf_config((std::filesystem::path(config.model.hf) / "config.json").string());
  if (!config.model.hf.empty()) train::extend_context(config.model, mc, "`model.hf` = `" + config.model.hf + "`");
  train::AutoSeqLen seq_len;
  seq_len.model_max_seq_len = mc.max_seq_len;
  const std::unique_ptr<data::TrainingData> data =
      train::open_training_data(config, *tokenizer, mc.vocab_size, ranks, nullptr, 0, &seq_len);
  log::info("data: " + data->summary());
  const train::LaunchChoices choices = train::resolve_run_shape(config, seq_len, *data, ranks);
  for (const std::string& line : train::launch_choice_lines(config, choices)) log::info(line);

  const train::TrainingSection& tc = config.training;
  const int64_t S = tc.steps, A = tc.grad_accum_steps, B = tc.batch_size, T = tc.seq_len, G = B * ranks;
  const bool document_mask = train::resolve_document_mask(config.data);
  const std::vector<int64_t> evals = eval_steps(config);
  const int64_t available = config.eval.enabled ? data->eval_batches(B, T) : 0;
  const int64_t wanted = config.eval.batches > 0 ? config.eval.batches : available;
  const int64_t E = config.eval.enabled ? std::min(wanted, (available + ranks - 1) / ranks) : 0;
  const double bytes = 4.0 * static_cast<double>((S * A + E) * G * T) * (document_mask ? 3 : 2);
  log::info(fmt::format("batches: {} steps x {} micro-batches x {} sequences x {} tokens, {} held-out batches: "
                        "{:.1f} MB",
                        S, A, G, T, E, bytes / 1e6));

  // Rank r's rows of a global batch are r*B .. r*B + B-1, drawn as the trainer's rank r draws them.
  Tensor ids = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "ids");
  Tensor targets = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "targets");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto put_rows = [&](Tensor& all_ids, Tensor& all_targets, Tensor* all_positions, int64_t row) {
    std::memcpy(all_ids.data<int32_t>() + row * T, ids.data<int32_t>(), sizeof(int32_t) * B * T);
    std::memcpy(all_targets.data<int32_t>() + row * T, targets.data<int32_t>(), sizeof(int32_t) * B * T);
    if (all_positions != nullptr) {
      const Tensor p = ops::document_positions(ids, tokenizer->bos_id());
      std::memcpy(all_positions->data<int32_t>() + row * T, p.data<int32_t>(), sizeof(int32_t) * B * T);
    }
  };
  {
    Tensor all_ids = Tensor::empty({S, A, G, T}, DType::kI32, Device::cpu(), "train.ids");
    Tensor all_targets = Tensor::empty({S, A, G, T}, DType::kI32, Device::cpu(), "train.targets");
    Tensor all_positions =
        document_mask ? Tensor::empty({S, A, G, T}, DType::kI32, Device::cpu(), "train.positions") : Tensor();
    for (int64_t s = 0; s < S; ++s)
      for (int64_t m = 0; m < A; ++m)
        for (int64_t r = 0; r < ranks; ++r) {
          data->fill_train(ids, targets, s + 1, m, r * B);
          put_rows(all_ids, all_targets, document_mask ? &all_positions : nullptr, (s * A + m) * G + r * B);
        }
    tensors.emplace_back("train.ids", std::move(all_ids));
    tensors.emplace_back("train.targets", std::move(all_targets));
    if (document_mask) tensors.emplace_back("train.positions", std::move(all_positions));
  }
  if (E > 0) {
    Tensor all_ids = Tensor::empty({E, G, T}, DType::kI32, Device::cpu(), "eval.ids");
    Tensor all_targets = Tensor::empty({E, G, T}, DType::kI32, Device::cpu(), "eval.targets");
    Tensor all_positions =
        document_mask ? Tensor::empty({E, G, T}, DType::kI32, Device::cpu(), "eval.positions") : Tensor();
    for (int64_t i = 0; i < E; ++i)
      for (int64_t r = 0; r < ranks; ++r) {
        // as Trainer::evaluate: rank r evaluates batch i*W + r; past the split, rows that count nothing
        if (const int64_t index = i * ranks + r; index < available) {
          data->fill_eval(ids, targets, index);
        } else {
          std::fill_n(ids.data<int32_t>(), B * T, 0);
          std::fill_n(targets.data<int32_t>(), B * T, model::StepOptions{}.ignore_index);
        }
        put_rows(all_ids, all_targets, document_mask ? &all_positions : nullptr, i * G + r * B);
      }
    tensors.emplace_back("eval.ids", std::move(all_ids));
    tensors.emplace_back("eval.targets", std::move(all_targets));
    if (document_mask) tensors.emplace_back("eval.positions", std::move(all_positions));
  }
  {
    const optim::ScheduleConfig sc = train::schedule_config(config);
    Tensor lr = Tensor::empty({S}, DType::kF64, Device::cpu(), "lr");
    for (int64_t s = 0; s < S; ++s) lr.data<double>()[s] = optim::learning_rate(sc, s + 1);
    tensors.emplace_back("lr", std::move(lr));
  }
  // What another engine needs besides the rows, flat; the whole resolved job in `config`.
  const nlohmann::ordered_json recipe = {
      {"steps", S},
      {"grad_accum_steps", A},
      {"batch_size", B},
      {"ranks", ranks},
      {"seq_len", T},
      {"ignore_index", model::StepOptions{}.ignore_index},
      {"loss", "the sum of the token losses of a step's global batch (all micro-batches) over its counted tokens"},
      {"document_mask", document_mask},
      {"bos_id", tokenizer->bos_id()},
      {"eval_steps", evals},
      {"eval_loss", "the sum of the token losses of every held-out batch over their counted tokens"},
      {"max_grad_norm", tc.max_grad_norm},
      {"beta1", config.optimizer.beta1},
      {"beta2", config.optimizer.beta2},
      {"eps", config.optimizer.eps},
      {"weight_decay", config.optimizer.weight_decay},
      {"decay_1d", config.optimizer.decay_1d},
      {"seed", tc.seed},
  };
  const std::map<std::string, std::string> metadata = {{"recipe", recipe.dump()},
                                                       {"config", train::config_toml(config)}};
  std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  io::write_safetensors(out, tensors, metadata);
  std::printf("wrote %s: %lld steps x %lld micro-batches x %lld sequences x %lld tokens, %lld held-out batches "
              "(evaluated at %zu steps)\n",
              out.c_str(), static_cast<long long>(S), static_cast<long long>(A), static_cast<long long>(G),
              static_cast<long long>(T), static_cast<long long>(E), evals.size());
  return 0;
}

}  // namespace shardtrain::cli
