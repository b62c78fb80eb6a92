// A job's training data from its `data` section: the built-in corpus, text and JSONL documents,
// token files and supervised fine-tuning examples, behind one data::TrainingData.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "train/config.h"
#include "train/launch_defaults.h"

namespace shardtrain::dist {
class Communicator;
}  // namespace shardtrain::dist

namespace shardtrain::train {

// One source of data.mix, its weight normalised (the weights sum to 1), and its name in the
// evaluation's report (its file or folder name without data suffixes, made unique).
struct MixEntry {
  std::string source;
  double weight = 0;
  std::string name;
};
// Parses `path=weight, path=weight, ...`; errors name the entry.
std::vector<MixEntry> parse_data_mix(const std::string& mix);

// data.format with "auto" resolved: tokens when data.source is a folder or a file that starts
// with a token file's magic, jsonl for .jsonl / .json, text otherwise (and for builtin: sources).
// Errors name `key`, the config key data.source came from (data.eval_source, or data.mix for
// one of its entries).
std::string resolve_data_format(const DataSection& data, const std::string& key = "data.source");

// data.document_mask with "auto" resolved: on for packed fine-tuning examples (sft, chat with
// data.packing), off for document streams.
bool resolve_document_mask(const DataSection& data);

// What `data.tokenizer` takes, for errors: auto, byte, or a tokenizer.json's path.
extern const char* const kDataTokenizerValues;

// The tokenizer a job uses, as `data.tokenizer` and `model.hf` choose it.
struct TokenizerChoice {
  std::string spec;    // "byte", or a tokenizer.json or its folder (data::load_tokenizer)
  std::string source;  // what a checkpoint records and an export copies: spec; "" for the byte tokenizer
  std::string reason;  // which tokenizer, and why: "the byte-level tokenizer (data.tokenizer = byte)"
};
// auto: model.hf's tokenizer.json when model.hf names a folder holding one, else the
// byte-level tokenizer (no model.hf, or a folder without tokenizer.json); byte: the byte-level
// tokenizer; anything else: a tokenizer.json or the folder holding one.
TokenizerChoice choose_tokenizer(const DataSection& data, const std::string& hf);
// The chosen tokenizer, loaded; errors name `data.tokenizer` and the values it takes.
std::unique_ptr<data::Tokenizer> load_chosen_tokenizer(const TokenizerChoice& choice);
// load_chosen_tokenizer(choose_tokenizer(data, hf)).
std::unique_ptr<data::Tokenizer> make_tokenizer(const DataSection& data, const std::string& hf);

// training.seq_len = 0 (auto): open_training_data chooses it from the model's context and the
// longest fine-tuning example of its sources (documents are not measured), and says so here.
struct AutoSeqLen {
  int64_t model_max_seq_len = 0;  // the model's context (model.max_seq_len, or model.hf's)
  SeqLenChoice chosen;            // what open_training_data chose, and why
};

// Reads data.source as its format says, split by data.val_fraction and seeded by
// training.seed, for sequences of training.seq_len; `model_vocab` bounds a token file's ids
// and `world` ranks share each global batch (SFT epochs count global sequences). Text, JSONL
// and Parquet documents go through a token cache when data.token_cache says so: every rank of
// `comm` (nullptr: this process alone) calls this together; rank 0 builds a missing cache, then
// the rank with `local_rank` 0 on each machine that does not see rank 0's folder. With
// data.eval_source, training reads all of data.source and evaluation all of data.eval_source.
// With training.seq_len = 0, `seq_len` (required then) gives the model's context and receives
// the length chosen, at which the data is cut.
std::unique_ptr<data::TrainingData> open_training_data(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                       int64_t model_vocab, int64_t world,
                                                       dist::Communicator* comm = nullptr, int local_rank = 0,
                                                       AutoSeqLen* seq_len = nullptr);

// The run's shape once its data is read, as the trainer decides it: training.seq_len = 0 takes
// the length open_training_data chose, training.epochs sets training.steps (for `data_parallel`
// ranks sharing each global batch), schedule.warmup_fraction sets schedule.warmup_steps; the
// cross-key checks run again. Returns what was chosen, for launch_choice_lines.
LaunchChoices resolve_run_shape(JobConfig& config, const AutoSeqLen& seq_len, const data::TrainingData& data,
                                int64_t data_parallel);

}  // namespace shardtrain::train
