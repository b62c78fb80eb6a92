// What training reads: token streams (documents as [BOS] tokens [EOS], packed end to end, in
// memory or in a token file) cut into windows, and the TrainingData interface the trainer
// draws batches from. Every training batch is a pure function of (seed, step, micro-batch,
// sequence index), so resumed runs and every rank's share of a global batch are reproducible
// with no sampler state beyond the step number.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/corpus.h"
#include "data/tokenize_file.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

struct TokenStreams {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
  int64_t documents = 0;
  int64_t bytes = 0;
};

// Documents `first_index` .. of `documents`, encoded on every OpenMP thread (the tokenizer's
// encode must be thread-safe; both of ours are), then handed to take(held_out, ids) in order.
// Each document is held out with probability val_fraction (1: every one, an evaluation
// source), decided by a hash of (seed, document index), so the split depends on neither the
// order of work nor how a source is cut into blocks. `ids` is the document as a stream holds it: BOS (when the tokenizer has one),
// its ids, EOS (likewise). Errors name the document.
using TakeDocument = std::function<void(bool held_out, std::span<const int32_t> ids)>;
void encode_and_split(std::span<const std::string> documents, int64_t first_index, const Tokenizer& tokenizer,
                      double val_fraction, uint64_t seed, const TakeDocument& take);

// Each document goes to the validation split as encode_and_split says; the streams are the
// same for any number of threads.
TokenStreams build_token_streams(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                 double val_fraction, uint64_t seed);
// encode_and_split over a reader's documents, a block of 16 MB at a time (two blocks are held:
// the next is read on another thread while this one is encoded), logging "data: tokenizing
// `source`: ..." every 10 s when `progress` is set. Throws when the source held no document.
void encode_and_split(DocumentReader& reader, const Tokenizer& tokenizer, double val_fraction, uint64_t seed,
                      bool progress, const TakeDocument& take);
// The same streams as from the documents, from a reader's.
TokenStreams build_token_streams(DocumentReader& reader, const Tokenizer& tokenizer, double val_fraction,
                                 uint64_t seed, bool progress = false);

// A sequence of token ids: in memory, or a range of a mapped token file (never copied whole).
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // Copies ids [first, first + out.size()); throws past the end.
  virtual void read(int64_t first, std::span<int32_t> out) const = 0;
};

class VectorTokenSource final : public TokenSource {
 public:
  explicit VectorTokenSource(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  int64_t size() const override { return static_cast<int64_t>(ids_.size()); }
  void read(int64_t first, std::span<int32_t> out) const override;

 private:
  std::vector<int32_t> ids_;
};

// Token files read as one stream, in the order given (each mapped, never copied whole).
class TokenFiles {
 public:
  explicit TokenFiles(const std::vector<std::string>& paths);
  int64_t size() const { return starts_.back(); }
  // Copies ids [first, first + out.size()) of the joined stream, across files.
  void read(int64_t first, std::span<int32_t> out) const;
  const std::vector<TokenFile>& files() const { return files_; }

 private:
  std::vector<TokenFile> files_;
  std::vector<int64_t> starts_;  // [files + 1]: the first id of each file in the joined stream, then the total
};

// Ids [first, first + count) of token files shared by the sources cut from them.
class FileTokenSource final : public TokenSource {
 public:
  FileTokenSource(std::shared_ptr<const TokenFiles> files, int64_t first, int64_t count);
  int64_t size() const override { return count_; }
  void read(int64_t first, std::span<int32_t> out) const override;

 private:
  std::shared_ptr<const TokenFiles> files_;
  int64_t first_, count_;
};

// Draws training windows of T+1 tokens at positions that are a pure function of
// (seed, step, micro-batch, sequence index).
class WindowSampler {
 public:
  WindowSampler(const TokenSource* stream, int64_t seq_len, uint64_t seed);

  // ids_BT = window[0:T], targets_BT = window[1:T+1] for sequences
  // first_sequence .. first_sequence + B - 1 of micro-batch `micro` of step `step`.
  void fill(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro, int64_t first_sequence) const;

 private:
  const TokenSource* stream_;
  int64_t seq_len_;
  uint64_t seed_;
};

// Evaluation batches: consecutive non-overlapping windows from the start of the stream.
// Batch `index` holds windows index*B .. index*B + B-1, so a global batch of W*B
// sequences split over W ranks is batches i*W + r. Returns false when the stream has no
// window left for batch `index`.
bool fill_eval_batch(Tensor& ids_BT, Tensor& targets_BT, const TokenSource& stream, int64_t index);
// How many such batches of B x T the stream holds.
int64_t eval_batches_available(int64_t stream_tokens, int64_t B, int64_t T);

// One pass over a training split, for training.epochs: packed sequences (fine-tuning examples,
// read in order epoch after epoch) or tokens (a stream, drawn as random windows).
struct EpochSize {
  enum class Unit { kSequences, kTokens };
  Unit unit = Unit::kSequences;
  int64_t count = 0;
};

// Where the trainer's batches come from. ids and targets are [B, T] i32 host tensors; a
// target of -100 (model::StepOptions::ignore_index) is a position whose loss does not count.
class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // Training sequences first_sequence .. first_sequence + B - 1 of micro-batch `micro` of
  // step `step` (a pure function of these and the data's seed).
  virtual void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                          int64_t first_sequence) const = 0;
  // Held-out batches of B x T: how many there are, and batch `index` (< that number). Data whose
  // last batch may be partial (fine-tuning examples) fills the rows past the split's end with
  // targets of -100, which count no token.
  virtual int64_t eval_batches(int64_t B, int64_t T) const = 0;
  virtual void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const = 0;
  // One line for the log: what was read and how it was split.
  virtual std::string summary() const = 0;
  // The held-out split's size in words, for errors ("1234 tokens", "12 examples in 3 sequences").
  virtual std::string held_out_size() const = 0;
  // The training split's size for training.epochs; nullopt where an epoch means nothing
  // (random tokens, a mix of sources).
  virtual std::optional<EpochSize> epoch_size() const { return std::nullopt; }
  // Data mixed from several sources evaluates each: their names, and which one held-out
  // batch `index` comes from. Empty: one source, reported as the whole.
  virtual std::vector<std::string> eval_part_names() const { return {}; }
  virtual int64_t eval_part(int64_t /*index*/) const { return 0; }
  // Data read in order, epoch after epoch (fine-tuning examples): fill_train's sequences are
  // training sequence g of one stream, and fill_sequence(g) puts that sequence in row 0 of
  // [1, T] tensors, so that a mix takes each such source's sequences in its own order.
  virtual bool in_order() const { return false; }
  virtual void fill_sequence(Tensor& /*ids_1T*/, Tensor& /*targets_1T*/, int64_t /*g*/) const {
    ST_THROW("fill_sequence: this data is not read in order");
  }
};

// Documents packed end to end, trained on in random windows, evaluated on consecutive ones.
class PackedStreamData final : public TrainingData {
 public:
  // held_out_only: data for evaluation alone (an evaluation source), whose training part may
  // be empty and which fill_train refuses.
  PackedStreamData(std::unique_ptr<TokenSource> train, std::unique_ptr<TokenSource> val, int64_t seq_len,
                   uint64_t seed, std::string summary, bool held_out_only = false);
  void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                  int64_t first_sequence) const override;
  int64_t eval_batches(int64_t B, int64_t T) const override;
  void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const override;
  std::string summary() const override { return summary_; }
  std::string held_out_size() const override;
  std::optional<EpochSize> epoch_size() const override;

 private:
  std::unique_ptr<TokenSource> train_, val_;
  std::optional<WindowSampler> sampler_;
  std::string summary_;
};

// Random tokens, uniform over [0, vocab): no corpus at all (data.source = builtin:random, and
// `shardtrain bench`). Each sequence of seq_len + 1 tokens is a pure function of the seed and
// its place (step, micro-batch, sequence), like every other source, so ranks and resumed runs
// draw the same rows; the held-out batches are eval_batches_count more of them.
class RandomTokenData final : public TrainingData {
 public:
  RandomTokenData(int64_t vocab, uint64_t seed, int64_t eval_batches_count = 1024);
  void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                  int64_t first_sequence) const override;
  int64_t eval_batches(int64_t /*B*/, int64_t /*T*/) const override { return eval_batches_; }
  void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const override;
  std::string summary() const override;
  std::string held_out_size() const override;

 private:
  // row b: sequence first_row + b of `stream`, its tokens 0..T-1 as ids and 1..T as targets
  void fill_rows(Tensor& ids_BT, Tensor& targets_BT, uint64_t stream, int64_t first_row) const;
  int64_t vocab_;
  uint64_t seed_;
  int64_t eval_batches_;
};

// Token files written by `shardtrain tokenize` (`path` one file, or a folder whose token files
// are read in name order as one stream), split for training: the held-out part is the last
// val_fraction of the tokens, starting at the first document (BOS) at or after that point
// (val_fraction 1: all of it, for evaluation only).
// Checks each file against the run's tokenizer (same BOS and EOS, ids below model_vocab) and
// that the training part holds a window of seq_len + 1.
std::unique_ptr<TrainingData> open_token_file_data(const std::string& path, const Tokenizer& tokenizer,
                                                   int64_t model_vocab, double val_fraction, int64_t seq_len,
                                                   uint64_t seed);

// A training and a held-out token file, each read whole as its stream (a token cache's pair:
// data/token_cache.h), checked against the tokenizer and model_vocab like token files.
std::unique_ptr<TrainingData> open_split_token_files(const std::string& train_path, const std::string& val_path,
                                                     const Tokenizer& tokenizer, int64_t model_vocab,
                                                     int64_t seq_len, uint64_t seed, std::string summary,
                                                     bool held_out_only = false);

}  // namespace shardtrain::data
