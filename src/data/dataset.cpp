// Token streams and deterministic window sampling.
#include "data/dataset.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>

#include <fmt/format.h>

#include "core/log.h"
#include "core/random.h"
#include "data/corpus.h"
#include "data/parallel.h"

namespace shardtrain::data {

namespace {

void check_val_fraction(double val_fraction) {
  ST_CHECK(val_fraction >= 0 && val_fraction <= 1, "`data.val_fraction` must be in [0, 1], found ", val_fraction);
}

bool held_out(uint64_t seed, int64_t index, double val_fraction) {
  static const uint64_t key = name_key("validation split");
  return val_fraction >= 1 || uniform_at(seed, key, static_cast<uint64_t>(index)) < val_fraction;
}

}  // namespace

void encode_and_split(std::span<const std::string> documents, int64_t first_index, const Tokenizer& tokenizer,
                      double val_fraction, uint64_t seed, const TakeDocument& take) {
  check_val_fraction(val_fraction);
  std::vector<std::vector<int32_t>> ids(documents.size());
  const int32_t bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
  parallel_for_lowest_error(static_cast<int64_t>(documents.size()), 0, [&](int64_t i) {
    std::vector<int32_t>& out = ids[static_cast<size_t>(i)];
    if (bos >= 0) out.push_back(bos);
    const std::vector<int32_t> encoded =
        with_context([&] { return "tokenizing document " + std::to_string(first_index + i); },
                     [&] { return tokenizer.encode(documents[static_cast<size_t>(i)]); });
    out.insert(out.end(), encoded.begin(), encoded.end());
    if (eos >= 0) out.push_back(eos);
  });
  for (size_t i = 0; i < documents.size(); ++i)
    take(held_out(seed, first_index + static_cast<int64_t>(i), val_fraction), ids[i]);
}

namespace {

void append_to(TokenStreams& s, bool held_out, std::span<const int32_t> ids) {
  std::vector<int32_t>& out = held_out ? s.val : s.train;
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

TokenStreams build_token_streams(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                 double val_fraction, uint64_t seed) {
  check_val_fraction(val_fraction);
  TokenStreams s;
  constexpr size_t kBlock = 4096;  // documents encoded per parallel step
  const std::span<const std::string> all(documents);
  for (size_t first = 0; first < all.size(); first += kBlock) {
    encode_and_split(all.subspan(first, std::min(kBlock, all.size() - first)), static_cast<int64_t>(first),
                     tokenizer, val_fraction, seed, [&](bool held, std::span<const int32_t> ids) {
                       append_to(s, held, ids);
                     });
  }
  for (const std::string& d : documents) s.bytes += static_cast<int64_t>(d.size());
  s.documents = static_cast<int64_t>(documents.size());
  return s;
}

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void log_progress(const DocumentReader& reader, uint64_t tokens, double seconds) {
  const double mb = static_cast<double>(reader.text_bytes()) / 1e6;
  std::string line = fmt::format("data: tokenizing `{}`: {} documents, {:.0f} MB of text, {} tokens, {:.1f} MB/s",
                                 reader.source(), reader.documents(), mb, tokens, mb / seconds);
  const double done = reader.progress();
  if (done > 0 && done < 1) line += fmt::format(", {:.0f} % (about {:.0f} s left)", 100 * done, seconds * (1 - done) / done);
  log::info(line);
}

}  // namespace

void encode_and_split(DocumentReader& reader, const Tokenizer& tokenizer, double val_fraction, uint64_t seed,
                      bool progress, const TakeDocument& take) {
  // The next block is read (a JSONL block parsed) on a thread of its own while this one's
  // documents are encoded and taken. The reader is touched only by that thread until get().
  constexpr size_t kBlockBytes = size_t{16} << 20;
  const double start = seconds_now();
  double last_report = start;
  uint64_t tokens = 0;
  std::vector<std::string> block, next;
  bool more = reader.next(block, kBlockBytes);
  int64_t first = 0;
  while (more) {
    const int64_t next_first = reader.documents();
    next.clear();
    std::future<bool> reading = std::async(std::launch::async, [&] { return reader.next(next, kBlockBytes); });
    try {
      encode_and_split(std::span<const std::string>(block), first, tokenizer, val_fraction, seed,
                       [&](bool held_out, std::span<const int32_t> ids) {
                         tokens += ids.size();
                         take(held_out, ids);
                       });
    } catch (...) {
      reading.wait();  // the reader is not left working on the caller's objects
      throw;
    }
    more = reading.get();
    block.swap(next);
    first = next_first;
    const double now = seconds_now();
    if (progress && now - last_report >= 10) {
      log_progress(reader, tokens, now - start);
      last_report = now;
    }
  }
  reader.check_not_empty();
}

TokenStreams build_token_streams(DocumentReader& reader, const Tokenizer& tokenizer, double val_fraction,
                                 uint64_t seed, bool progress) {
  TokenStreams s;
  encode_and_split(reader, tokenizer, val_fraction, seed, progress,
                   [&](bool held_out, std::span<const int32_t> ids) { append_to(s, held_out, ids); });
  s.documents = reader.documents();
  s.bytes = static_cast<int64_t>(reader.text_bytes());
  return s;
}

void VectorTokenSource::read(int64_t first, std::span<int32_t> out) const {
  ST_CHECK(first >= 0 && first <= size() && static_cast<int64_t>(out.size()) <= size() - first, "reading tokens [",
           first, ", ", first + static_cast<int64_t>(out.size()), ") of a stream of ", size());
  std::copy_n(ids_.begin() + first, out.size(), out.begin());
}

TokenFiles::TokenFiles(const std::vector<std::string>& paths) : starts_{0} {
  ST_ASSERT(!paths.empty());
  for (const std::string& path : paths) {
    files_.emplace_back(path);
    starts_.push_back(starts_.back() + static_cast<int64_t>(files_.back().size()));
  }
}

void TokenFiles::read(int64_t first, std::span<int32_t> out) const {
  const auto n = static_cast<int64_t>(out.size());
  ST_CHECK(first >= 0 && first <= size() && n <= size() - first, "reading tokens [", first, ", ", first + n,
           ") of ", size());
  int64_t done = 0;
  // the file holding `first`: the last whose start is at or before it
  size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end() - 1, first) - starts_.begin()) - 1;
  while (done < n) {
    const int64_t at = first + done - starts_[f];
    const int64_t take = std::min(n - done, starts_[f + 1] - starts_[f] - at);
    files_[f].read(static_cast<uint64_t>(at), out.subspan(static_cast<size_t>(done), static_cast<size_t>(take)));
    done += take;
    ++f;
  }
}

FileTokenSource::FileTokenSource(std::shared_ptr<const TokenFiles> files, int64_t first, int64_t count)
    : files_(std::move(files)), first_(first), count_(count) {
  ST_ASSERT(first >= 0 && count >= 0 && first + count <= files_->size());
}

void FileTokenSource::read(int64_t first, std::span<int32_t> out) const {
  ST_CHECK(first >= 0 && first <= count_ && static_cast<int64_t>(out.size()) <= count_ - first, "reading tokens [",
           first, ", ", first + static_cast<int64_t>(out.size()), ") of a part of ", count_, " tokens");
  files_->read(first_ + first, out);
}

WindowSampler::WindowSampler(const TokenSource* stream, int64_t seq_len, uint64_t seed)
    : stream_(stream), seq_len_(seq_len), seed_(seed) {
  ST_CHECK(stream->size() > seq_len + 1, "training data has ", stream->size(),
           " tokens, fewer than one sequence of `training.seq_len` + 1 = ", seq_len + 1);
}

namespace {

// Row b of ids and targets from the T + 1 tokens of `window`.
void put_window(Tensor& ids_BT, Tensor& targets_BT, int64_t b, std::span<const int32_t> window) {
  const int64_t T = ids_BT.size(1);
  int32_t* ids = ids_BT.data<int32_t>() + b * T;
  int32_t* targets = targets_BT.data<int32_t>() + b * T;
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = window[t];
    targets[t] = window[t + 1];
  }
}

}  // namespace

void WindowSampler::fill(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                         int64_t first_sequence) const {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  ST_ASSERT(T == seq_len_ && targets_BT.shape() == ids_BT.shape());
  const uint64_t starts = static_cast<uint64_t>(stream_->size() - T - 1);
  const uint64_t key = hash3(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro));
  std::vector<int32_t> window(T + 1);
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t start = hash3(seed_, key, static_cast<uint64_t>(first_sequence + b)) % (starts + 1);
    stream_->read(static_cast<int64_t>(start), window);
    put_window(ids_BT, targets_BT, b, window);
  }
}

int64_t eval_batches_available(int64_t stream_tokens, int64_t B, int64_t T) {
  return stream_tokens < 1 ? 0 : (stream_tokens - 1) / (B * T);
}

bool fill_eval_batch(Tensor& ids_BT, Tensor& targets_BT, const TokenSource& stream, int64_t index) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  if (index >= eval_batches_available(stream.size(), B, T)) return false;
  std::vector<int32_t> window(T + 1);
  for (int64_t b = 0; b < B; ++b) {
    stream.read((index * B + b) * T, window);
    put_window(ids_BT, targets_BT, b, window);
  }
  return true;
}

PackedStreamData::PackedStreamData(std::unique_ptr<TokenSource> train, std::unique_ptr<TokenSource> val,
                                   int64_t seq_len, uint64_t seed, std::string summary, bool held_out_only)
    : train_(std::move(train)), val_(std::move(val)), summary_(std::move(summary)) {
  if (!held_out_only) sampler_.emplace(train_.get(), seq_len, seed);
}

void PackedStreamData::fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                                  int64_t first_sequence) const {
  ST_CHECK(sampler_.has_value(), "this data was opened for evaluation only");
  sampler_->fill(ids_BT, targets_BT, step, micro, first_sequence);
}

int64_t PackedStreamData::eval_batches(int64_t B, int64_t T) const {
  return eval_batches_available(val_->size(), B, T);
}

void PackedStreamData::fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const {
  ST_CHECK(fill_eval_batch(ids_BT, targets_BT, *val_, index), "evaluation batch ", index, " is past the held-out ",
           held_out_size());
}

std::string PackedStreamData::held_out_size() const { return std::to_string(val_->size()) + " tokens"; }

std::optional<EpochSize> PackedStreamData::epoch_size() const {
  if (!sampler_) return std::nullopt;  // evaluation only
  return EpochSize{EpochSize::Unit::kTokens, train_->size()};
}

RandomTokenData::RandomTokenData(int64_t vocab, uint64_t seed, int64_t eval_batches_count)
    : vocab_(vocab), seed_(seed), eval_batches_(eval_batches_count) {
  ST_CHECK(vocab > 0, "random tokens need a vocabulary of at least 1 token, found ", vocab);
  ST_CHECK(eval_batches_count > 0, "random tokens: eval_batches_count must be positive");
}

void RandomTokenData::fill_rows(Tensor& ids_BT, Tensor& targets_BT, uint64_t stream, int64_t first_row) const {
  ST_CHECK(ids_BT.ndim() == 2 && ids_BT.dtype() == DType::kI32 && ids_BT.device().is_cpu() &&
               targets_BT.shape() == ids_BT.shape() && targets_BT.dtype() == DType::kI32,
           "random tokens: expected host i32 ids and targets [B, T] of one shape, found ", ids_BT.str(), " and ",
           targets_BT.str());
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  int32_t* ids = ids_BT.data<int32_t>();
  int32_t* targets = targets_BT.data<int32_t>();
  const auto vocab = static_cast<uint64_t>(vocab_);
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t key = hash3(seed_, stream, static_cast<uint64_t>(first_row + b));
    for (int64_t t = 0; t < T; ++t) {
      ids[b * T + t] = static_cast<int32_t>(hash3(seed_, key, static_cast<uint64_t>(t)) % vocab);
      targets[b * T + t] = static_cast<int32_t>(hash3(seed_, key, static_cast<uint64_t>(t + 1)) % vocab);
    }
  }
}

void RandomTokenData::fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                                 int64_t first_sequence) const {
  // a stream per (step, micro-batch); the held-out batches' streams are keyed apart (fill_eval)
  fill_rows(ids_BT, targets_BT, hash3(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro)), first_sequence);
}

void RandomTokenData::fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const {
  ST_CHECK(index >= 0 && index < eval_batches_, "evaluation batch ", index, " is past the ", eval_batches_,
           " batches of random tokens");
  fill_rows(ids_BT, targets_BT, hash3(seed_, ~uint64_t{0}, static_cast<uint64_t>(index)), 0);
}

std::string RandomTokenData::summary() const {
  return fmt::format("random tokens, uniform over a vocabulary of {} (builtin:random; no corpus read)", vocab_);
}

std::string RandomTokenData::held_out_size() const {
  return fmt::format("{} batches of random tokens", eval_batches_);
}

namespace {

// `path` itself, or the token files of folder or pattern `path` in name order.
std::vector<std::string> token_file_paths(const std::string& path) {
  if (!std::filesystem::is_directory(path) && !is_source_pattern(path)) return {path};
  std::vector<std::string> paths;
  for (const std::string& f : source_files(path))
    if (is_token_file(f)) paths.push_back(f);
  ST_CHECK(!paths.empty(), "`", path, "` ", is_source_pattern(path) ? "matches no token files" : "is a folder without token files",
           " (written by `shardtrain tokenize`)");
  return paths;
}

void check_token_file(const TokenFile& file, const Tokenizer& tokenizer, int64_t model_vocab) {
  const TokenFileHeader& h = file.header();
  const std::string& path = file.path();
  ST_CHECK(h.vocab_size <= model_vocab, "token file `", path, "` holds ids below ", h.vocab_size,
           ", more than the model's vocabulary of ", model_vocab, "; it was tokenized for another model");
  ST_CHECK(h.eos_id == tokenizer.eos_id(), "token file `", path, "` ends documents with id ", h.eos_id,
           " but the run's tokenizer has EOS ", tokenizer.eos_id(),
           "; it was tokenized with another tokenizer (`data.tokenizer`)");
  ST_CHECK(!(h.version == 1 && tokenizer.bos_id() >= 0), "token file `", path,
           "` is a version 1 file, which stores no BOS, and the run's tokenizer begins documents with BOS ",
           tokenizer.bos_id(), ": tokenize the corpus again with this build's `shardtrain tokenize`");
  ST_CHECK(h.version == 1 || h.bos_id == tokenizer.bos_id(), "token file `", path, "` begins documents with id ",
           h.bos_id, " but the run's tokenizer has BOS ", tokenizer.bos_id(),
           "; it was tokenized with another tokenizer (`data.tokenizer`)");
}

}  // namespace

std::unique_ptr<TrainingData> open_token_file_data(const std::string& path, const Tokenizer& tokenizer,
                                                   int64_t model_vocab, double val_fraction, int64_t seq_len,
                                                   uint64_t seed) {
  check_val_fraction(val_fraction);
  auto files = std::make_shared<const TokenFiles>(token_file_paths(path));
  uint64_t documents = 0;
  for (const TokenFile& f : files->files()) {
    check_token_file(f, tokenizer, model_vocab);
    documents += f.header().document_count;
  }
  const int64_t total = files->size();
  int64_t cut = total;
  if (val_fraction >= 1) {
    cut = 0;
  } else if (val_fraction > 0) {
    // The held-out part starts at a document boundary: the first BOS (or, without one, the
    // token after an EOS) at or after the nominal cut, looked for in pieces.
    cut = static_cast<int64_t>(static_cast<double>(total) * (1 - val_fraction));
    const int32_t bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
    const bool after_eos = bos < 0;
    std::vector<int32_t> piece(1 << 16);
    int64_t pos = after_eos ? std::max<int64_t>(cut - 1, 0) : cut;
    bool found = false;
    while (!found && pos < total) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(piece.size()), total - pos);
      files->read(pos, std::span<int32_t>(piece.data(), static_cast<size_t>(n)));
      for (int64_t i = 0; i < n && !found; ++i) {
        if (after_eos ? piece[i] == eos : piece[i] == bos) {
          cut = pos + i + (after_eos ? 1 : 0);
          found = true;
        }
      }
      pos += n;
    }
    if (!found) cut = total;
  }
  const size_t count = files->files().size();
  std::string summary = std::to_string(documents) + " documents, " + std::to_string(total) + " tokens in " +
                        (count == 1 ? "token file `" + files->files()[0].path() + "`"
                                    : std::to_string(count) + " token files in `" + path + "`") +
                        " -> " + std::to_string(cut) + " training / " + std::to_string(total - cut) +
                        " held-out tokens";
  return std::make_unique<PackedStreamData>(std::make_unique<FileTokenSource>(files, 0, cut),
                                            std::make_unique<FileTokenSource>(files, cut, total - cut), seq_len,
                                            seed, std::move(summary), val_fraction >= 1);
}

std::unique_ptr<TrainingData> open_split_token_files(const std::string& train_path, const std::string& val_path,
                                                     const Tokenizer& tokenizer, int64_t model_vocab,
                                                     int64_t seq_len, uint64_t seed, std::string summary,
                                                     bool held_out_only) {
  auto train = std::make_shared<const TokenFiles>(std::vector<std::string>{train_path});
  auto val = std::make_shared<const TokenFiles>(std::vector<std::string>{val_path});
  check_token_file(train->files()[0], tokenizer, model_vocab);
  check_token_file(val->files()[0], tokenizer, model_vocab);
  const int64_t train_tokens = train->size(), val_tokens = val->size();
  return std::make_unique<PackedStreamData>(std::make_unique<FileTokenSource>(std::move(train), 0, train_tokens),
                                            std::make_unique<FileTokenSource>(std::move(val), 0, val_tokens),
                                            seq_len, seed, std::move(summary), held_out_only);
}

}  // namespace shardtrain::data
