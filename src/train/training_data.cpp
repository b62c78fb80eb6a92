// Opening a job's training data; the loaders and samplers themselves live in data/.
#include "train/training_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "data/corpus.h"
#include "data/sft.h"
#include "data/token_cache.h"
#include "data/tokenize_file.h"
#include "dist/communicator.h"
#include "io/input_file.h"
#include "io/parquet.h"

namespace shardtrain::train {
namespace {

std::string megabytes(uint64_t bytes) { return fmt::format("{:.2f} MB", static_cast<double>(bytes) / 1e6); }

// Runs build() where `builds` says so, then agrees across the ranks that every build went
// well: a rank whose build failed rethrows its error, the others name it.
void build_where(bool builds, const std::string& folder, const std::function<void()>& build,
                 dist::Communicator& comm) {
  std::exception_ptr error;
  if (builds && !data::token_cache_complete(folder)) {
    try {
      build();
    } catch (...) {
      error = std::current_exception();
    }
  }
  Tensor failed = Tensor::zeros({2}, DType::kF32, Device::cpu(), "token cache status");
  if (error) {
    failed.data<float>()[0] = 1;
    failed.data<float>()[1] = static_cast<float>(comm.rank() + 1);
  }
  comm.all_reduce(failed, dist::ReduceOp::kSum);
  if (error) std::rethrow_exception(error);
  ST_CHECK(failed.data<float>()[0] == 0, "the token cache `", folder, "` could not be built (",
           failed.data<float>()[0], " rank(s) failed; see rank ", failed.data<float>()[1] - 1, "'s error)");
}

// The cache folder for `key`, or "" when the source is tokenized in memory (data.token_cache
// off, or auto and a source under 64 MiB, or no folder or tokenizer fingerprint to key it by).
std::string cache_folder(const DataSection& d, const data::TokenCacheKey& key, const data::Tokenizer& tokenizer) {
  if (d.token_cache == "off" || d.source.rfind("builtin:", 0) == 0) return {};
  const bool on = d.token_cache == "on";
  constexpr uint64_t kAutoBytes = uint64_t{64} << 20;
  if (!on && data::token_cache_source_bytes(key) < kAutoBytes) return {};
  const std::string dir = d.cache_dir.empty() ? data::default_token_cache_dir() : d.cache_dir;
  if (dir.empty() || tokenizer.fingerprint().empty()) {
    const std::string why = dir.empty() ? "neither XDG_CACHE_HOME nor HOME is set, and data.cache_dir is empty"
                                        : "the tokenizer does not say what it encodes by";
    ST_CHECK(!on, "`data.token_cache` = on, but ", why);
    log::info("data: tokenizing in memory (no token cache: " + why + ")");
    return {};
  }
  return data::token_cache_folder(dir, key, tokenizer);
}

// Makes `folder` complete for this rank: rank 0 builds it when missing, then, for ranks that
// do not see its folder, the first rank of each machine. Every rank calls it together.
// Returns whether every rank found it complete already.
bool ensure_cache(const std::string& folder, const std::function<void()>& build, dist::Communicator* comm,
                  int local_rank) {
  std::unique_ptr<dist::Communicator> single;
  if (comm == nullptr) {
    single = dist::make_single_rank();
    comm = single.get();
  }
  // Decided together: a rank that arrives after rank 0 finished building sees a complete
  // folder, and must still take part in the collectives the others are in.
  Tensor missing = Tensor::empty({1}, DType::kF32, Device::cpu(), "token cache missing");
  missing.data<float>()[0] = data::token_cache_complete(folder) ? 0.0f : 1.0f;
  comm->all_reduce(missing, dist::ReduceOp::kSum);
  if (missing.data<float>()[0] == 0) return true;
  build_where(comm->rank() == 0, folder, build, *comm);
  // ranks on machines that do not share rank 0's folder build their own copy, once a machine
  build_where(local_rank == 0, folder, build, *comm);
  ST_CHECK(data::token_cache_complete(folder), "the token cache `", folder, "` is not visible to this rank after "
           "its machine's first rank (LOCAL_RANK 0) built it; set data.cache_dir to a folder every rank of a "
           "machine shares");
  return false;
}

void log_building(const std::string& source, const std::string& folder) {
  log::info(fmt::format("data: tokenizing `{}` into the token cache `{}` (once; later launches read it)", source,
                        folder));
}

// The token cache of a document source, or nullptr when it is tokenized in memory.
std::unique_ptr<data::TrainingData> open_document_cache(const DataSection& d, const std::string& format,
                                                        const data::Tokenizer& tokenizer, int64_t model_vocab,
                                                        const TrainingSection& t, dist::Communicator* comm,
                                                        int local_rank) {
  const data::DocumentSource documents{d.source, data::parse_document_format(format), d.text_field, d.val_fraction,
                                       t.seed};
  const std::string folder = cache_folder(d, data::document_cache_key(documents), tokenizer);
  if (folder.empty()) return nullptr;
  const bool reused = ensure_cache(folder, [&] {
    log_building(d.source, folder);
    const data::TokenCacheStats s = data::build_token_cache(folder, documents, tokenizer, true);
    log::info(fmt::format("data: token cache built in {:.1f} s: {} documents, {} of text, {:.1f} MB/s{}", s.seconds,
                          s.documents, megabytes(s.text_bytes), static_cast<double>(s.text_bytes) / 1e6 / s.seconds,
                          s.built ? "" : " (another process finished it first; its copy is used)"));
  }, comm, local_rank);
  data::mark_token_cache_used(folder);
  const nlohmann::ordered_json info = data::read_cache_info(folder);
  std::string summary;
  try {
    summary = fmt::format("{} documents, {} of text -> {} training / {} held-out tokens ({}; token cache `{}`, {})",
                          info.at("documents").get<int64_t>(), megabytes(info.at("text_bytes").get<uint64_t>()),
                          info.at("train_tokens").get<uint64_t>(), info.at("val_tokens").get<uint64_t>(), d.source,
                          folder, reused ? "made by an earlier launch" : "made now");
  } catch (const nlohmann::json::exception& e) {
    ST_THROW("token cache `", folder, "/source.json`: ", e.what(), "; remove the folder to rebuild it");
  }
  const std::filesystem::path f(folder);
  return data::open_split_token_files((f / "train.tok").string(), (f / "val.tok").string(), tokenizer, model_vocab,
                                      t.seq_len, t.seed, std::move(summary), d.val_fraction >= 1);
}

// Fine-tuning examples tokenized, in file order, and the end of the summary's first part
// saying where they came from (a token cache, or none).
struct LoadedExamples {
  std::vector<data::SftExample> examples;
  std::string origin;
};

// Examples read ahead of packing (training.seq_len = 0 measures them first), by source; each
// is taken out when its data is opened, so no source is read twice.
using ExampleCache = std::map<std::string, LoadedExamples>;

// Fine-tuning examples, through a token cache of the tokenized examples where it applies.
LoadedExamples load_examples(const DataSection& d, const std::string& format, const data::Tokenizer& tokenizer,
                             int64_t model_vocab, const data::SftOptions& o, dist::Communicator* comm,
                             int local_rank) {
  data::TokenCacheKey key{d.source, format, nlohmann::ordered_json::object()};
  if (o.format == data::SftFormat::kChat) {
    key.settings["messages_field"] = o.messages_field;
  } else {
    key.settings["prompt_field"] = o.prompt_field;
    key.settings["response_field"] = o.response_field;
  }
  key.settings["train_on_prompt"] = o.train_on_prompt;
  const std::string folder = cache_folder(d, key, tokenizer);
  if (folder.empty()) return {data::read_sft_examples(d.source, tokenizer, o), ""};
  const std::string file = (std::filesystem::path(folder) / "examples.bin").string();
  const bool reused = ensure_cache(folder, [&] {
    log_building(d.source, folder);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<data::SftExample> examples = data::read_sft_examples(d.source, tokenizer, o);
    const bool built = data::build_cache_folder(folder, key, tokenizer, [&](const std::string& tmp) {
      data::write_sft_examples((std::filesystem::path(tmp) / "examples.bin").string(), examples,
                               tokenizer.vocab_size());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return nlohmann::ordered_json{{"examples", examples.size()}, {"seconds", seconds}};
    });
    log::info(fmt::format("data: token cache built in {:.1f} s: {} examples{}",
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                          examples.size(), built ? "" : " (another process finished it first; its copy is used)"));
  }, comm, local_rank);
  data::mark_token_cache_used(folder);
  return {data::read_sft_examples_file(file, model_vocab),
          fmt::format("; token cache `{}`, {}", folder, reused ? "made by an earlier launch" : "made now")};
}

std::unique_ptr<data::TrainingData> open_examples(const DataSection& d, const std::string& format,
                                                  const data::Tokenizer& tokenizer, int64_t model_vocab,
                                                  const data::SftOptions& o, dist::Communicator* comm, int local_rank,
                                                  ExampleCache* cache) {
  LoadedExamples loaded;
  const auto it = cache != nullptr ? cache->find(d.source) : ExampleCache::iterator();
  if (cache != nullptr && it != cache->end()) {
    loaded = std::move(it->second);
    cache->erase(it);
  } else {
    loaded = load_examples(d, format, tokenizer, model_vocab, o, comm, local_rank);
  }
  return std::make_unique<data::SftData>(loaded.examples, d.source, tokenizer, o, loaded.origin);
}

// The options of fine-tuning examples in `format` (sft or chat) for `config`'s data section.
data::SftOptions sft_options(const JobConfig& config, const std::string& format, int64_t world) {
  const DataSection& d = config.data;
  const TrainingSection& t = config.training;
  data::SftOptions o;
  o.format = format == "chat" ? data::SftFormat::kChat : data::SftFormat::kPromptResponse;
  o.prompt_field = d.prompt_field;
  o.response_field = d.response_field;
  o.messages_field = d.messages_field;
  o.train_on_prompt = d.train_on_prompt;
  o.packing = d.packing;
  o.val_fraction = d.val_fraction;
  o.seq_len = t.seq_len;
  o.seed = t.seed;
  o.global_batch = t.batch_size * world;
  o.micro_batches = t.grad_accum_steps;
  return o;
}

}  // namespace

std::string resolve_data_format(const DataSection& d, const std::string& key) {
  // "`data.source` = `x`", or "`data.mix` entry `x`"
  const std::string what = key == "data.mix" ? fmt::format("`data.mix` entry `{}`", d.source)
                                             : fmt::format("`{}` = `{}`", key, d.source);
  ST_CHECK(d.source.rfind("builtin:", 0) != 0 || d.source == "builtin:fortunes" || d.source == "builtin:random",
           what, ": unknown built-in source; the built-in ones are builtin:fortunes (a "
           "corpus) and builtin:random (random tokens)");
  if (d.source == "builtin:random") {
    ST_CHECK(d.format == "auto", "`data.format` = ", d.format, " does not apply to builtin:random, random tokens");
    return "random";
  }
  if (d.source.rfind("builtin:", 0) == 0) {
    ST_CHECK(d.format == "auto" || d.format == "text", "`data.format` = ", d.format, " does not apply to the built-in "
             "corpus `", d.source, "`, which is text");
    return "text";
  }
  if (std::filesystem::is_directory(d.source) || data::is_source_pattern(d.source)) {
    // a folder or pattern: its token files, else its Parquet files
    const std::vector<std::string> files = data::source_files(d.source);
    const bool tokens = std::any_of(files.begin(), files.end(), [](const std::string& f) { return data::is_token_file(f); });
    if (tokens) {
      ST_CHECK(d.format == "auto" || d.format == "tokens", what, " names token files, which "
               "are read as such, not as `data.format` = ", d.format);
      return "tokens";
    }
    const bool parquet = std::any_of(files.begin(), files.end(), [](const std::string& f) { return io::is_parquet_file(f); });
    if (parquet) {
      ST_CHECK(d.format == "auto" || d.format == "parquet" || d.format == "sft" || d.format == "chat",
               what, " names Parquet files, which read as `data.format` = parquet, sft or "
               "chat, not ", d.format);
      return d.format == "auto" ? "parquet" : d.format;
    }
    // JSONL or text files, read one after another (data::document_files)
    const bool jsonl = std::any_of(files.begin(), files.end(), [](const std::string& f) { return data::is_jsonl_name(f); });
    const bool text = std::any_of(files.begin(), files.end(), [](const std::string& f) { return data::is_text_name(f); });
    ST_CHECK(jsonl || text || (data::is_source_pattern(d.source) && d.format != "auto"), what,
             " names ", files.size(), " files, none of them a token file (written by `shardtrain tokenize`), a "
             "Parquet file, JSONL (.jsonl, .json) or text (.txt; each also .gz or .zst)");
    if (d.format != "auto") {
      ST_CHECK(d.format != "parquet" && d.format != "tokens", "`data.format` = ", d.format, ", but `", d.source,
               "` names no ", d.format == "parquet" ? "Parquet" : "token", " files");
      return d.format;
    }
    return jsonl ? "jsonl" : "text";
  }
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(d.source, ec);
  ST_CHECK(std::filesystem::exists(status), what, ": no file or folder of that name");
  ST_CHECK(std::filesystem::is_regular_file(status), what, " is not a regular file or folder (",
           std::filesystem::is_fifo(status)             ? "a FIFO"
           : std::filesystem::is_character_file(status) ? "a character device"
           : std::filesystem::is_block_file(status)     ? "a block device"
           : std::filesystem::is_socket(status)         ? "a socket"
                                                        : "of another kind",
           "); training reads its data from files, which it opens more than once");
  if (io::is_parquet_file(d.source)) {
    ST_CHECK(d.format == "auto" || d.format == "parquet" || d.format == "sft" || d.format == "chat",
             what, " is a Parquet file, which reads as `data.format` = parquet (documents in "
             "data.text_field), sft or chat, not ", d.format);
    return d.format == "auto" ? "parquet" : d.format;
  }
  ST_CHECK(d.format != "parquet", "`data.format` = parquet, but `", d.source, "` is not a Parquet file (it does not "
           "start and end with PAR1)");
  if (d.format != "auto") return d.format;
  if (data::is_token_file(d.source)) return "tokens";
  const std::string ext = io::inner_extension(d.source);  // "corpus.jsonl.gz": .jsonl
  return (ext == ".jsonl" || ext == ".json") ? "jsonl" : "text";
}

bool resolve_document_mask(const DataSection& d) {
  if (d.document_mask != "auto") return d.document_mask == "on";
  // `auto` never finds examples: data.format names them, for data.source or every source of a mix
  const std::string format = d.mix.empty() ? resolve_data_format(d) : d.format;
  return (format == "sft" || format == "chat") && d.packing;
}

namespace {

// Training from one source, evaluation from another.
class TrainEvalData final : public data::TrainingData {
 public:
  TrainEvalData(std::unique_ptr<data::TrainingData> train, std::unique_ptr<data::TrainingData> eval)
      : train_(std::move(train)), eval_(std::move(eval)) {}
  void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                  int64_t first_sequence) const override {
    train_->fill_train(ids_BT, targets_BT, step, micro, first_sequence);
  }
  int64_t eval_batches(int64_t B, int64_t T) const override { return eval_->eval_batches(B, T); }
  void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const override {
    eval_->fill_eval(ids_BT, targets_BT, index);
  }
  std::string summary() const override {
    return "training: " + train_->summary() + "; evaluation (data.eval_source): " + eval_->summary();
  }
  std::string held_out_size() const override { return eval_->held_out_size() + " in data.eval_source"; }
  std::optional<data::EpochSize> epoch_size() const override { return train_->epoch_size(); }

 private:
  std::unique_ptr<data::TrainingData> train_, eval_;
};

// `key`: the config key data.source came from, for errors (resolve_data_format).
std::unique_ptr<data::TrainingData> open_source(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                int64_t model_vocab, int64_t world, dist::Communicator* comm,
                                                int local_rank, ExampleCache* cache,
                                                const std::string& key = "data.source");

}  // namespace

std::vector<MixEntry> parse_data_mix(const std::string& mix) {
  std::vector<MixEntry> entries;
  size_t pos = 0;
  while (pos <= mix.size()) {
    size_t end = mix.find(',', pos);
    if (end == std::string::npos) end = mix.size();
    std::string item = mix.substr(pos, end - pos);
    pos = end + 1;
    const size_t first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first == std::string::npos) {
      ST_CHECK(end == mix.size() && !entries.empty(), "`data.mix` = \"", mix, "\": an empty entry; write "
               "`path=weight, path=weight, ...`");
      break;
    }
    item = item.substr(first, last - first + 1);
    const size_t eq = item.rfind('=');
    ST_CHECK(eq != std::string::npos && eq > 0, "`data.mix`: entry `", item, "` is not `path=weight`");
    MixEntry e;
    e.source = item.substr(0, eq);
    e.source.erase(e.source.find_last_not_of(" \t") + 1);
    const std::string w = item.substr(eq + 1);
    size_t used = 0;
    try {
      e.weight = std::stod(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ST_CHECK(used > 0 && w.find_first_not_of(" \t", used) == std::string::npos && std::isfinite(e.weight) &&
                 e.weight > 0,
             "`data.mix`: the weight of `", e.source, "` is `", w, "`; expected a number > 0");
    entries.push_back(std::move(e));
  }
  ST_CHECK(!entries.empty(), "`data.mix` is empty");
  double total = 0;
  for (const MixEntry& e : entries) total += e.weight;
  for (MixEntry& e : entries) e.weight /= total;
  // names: each source's file or folder name, made unique
  for (MixEntry& e : entries) e.name = data::source_name(e.source);
  std::vector<int> same(entries.size(), 0);
  for (size_t i = 0; i < entries.size(); ++i)
    for (size_t j = 0; j < entries.size(); ++j) same[i] += entries[j].name == entries[i].name ? 1 : 0;
  for (size_t i = 0; i < entries.size(); ++i)
    if (same[i] > 1) entries[i].name = fmt::format("{}_{}", entries[i].name, i);
  return entries;
}

namespace {

// Data from several sources: each training sequence from one, drawn by weight from (seed,
// step, micro-batch, sequence); held-out batches from each in turn. A source read in order
// (fine-tuning examples) gives its next sequence each time it is drawn: its k-th draw in the
// global order of (step, micro-batch, sequence) reads its sequence k, so each such source goes
// through its epochs whole, whatever the others' weights. `global_batch` sequences make one
// micro-batch over all ranks, `micro_batches` of them a step.
class MixedData final : public data::TrainingData {
 public:
  MixedData(std::vector<MixEntry> entries, std::vector<std::unique_ptr<data::TrainingData>> parts, uint64_t seed,
            int64_t global_batch, int64_t micro_batches)
      : entries_(std::move(entries)), parts_(std::move(parts)), seed_(seed), global_batch_(global_batch),
        micro_batches_(micro_batches) {
    for (const auto& p : parts_) any_in_order_ = any_in_order_ || p->in_order();
  }

  void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                  int64_t first_sequence) const override {
    const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
    Tensor ids = Tensor::empty({1, T}, DType::kI32, Device::cpu(), "mix row");
    Tensor targets = Tensor::empty({1, T}, DType::kI32, Device::cpu(), "mix row targets");
    std::vector<int64_t> taken;  // per source read in order: the sequence its next draw reads
    if (any_in_order_) taken = taken_before(step, micro, first_sequence);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t sequence = first_sequence + b;
      const size_t s = source_at(step, micro, sequence);
      if (parts_[s]->in_order()) {
        parts_[s]->fill_sequence(ids, targets, taken[s]++);
      } else {
        parts_[s]->fill_train(ids, targets, step, micro, sequence);
      }
      std::copy_n(ids.data<int32_t>(), T, ids_BT.data<int32_t>() + b * T);
      std::copy_n(targets.data<int32_t>(), T, targets_BT.data<int32_t>() + b * T);
    }
  }
  // Batch i comes from source i mod S, its batch i / S: every source as many as the one with
  // the fewest has.
  int64_t eval_batches(int64_t B, int64_t T) const override {
    int64_t fewest = parts_[0]->eval_batches(B, T);
    for (const auto& p : parts_) fewest = std::min(fewest, p->eval_batches(B, T));
    return fewest * static_cast<int64_t>(parts_.size());
  }
  void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const override {
    const auto S = static_cast<int64_t>(parts_.size());
    parts_[static_cast<size_t>(index % S)]->fill_eval(ids_BT, targets_BT, index / S);
  }
  std::string summary() const override {
    std::string s = "mixed from " + std::to_string(parts_.size()) + " sources:";
    for (size_t i = 0; i < parts_.size(); ++i)
      s += fmt::format("{} {} ({:.1f} %): {}", i == 0 ? "" : ";", entries_[i].name, 100 * entries_[i].weight,
                       parts_[i]->summary());
    return s;
  }
  std::string held_out_size() const override {
    std::string s;
    for (size_t i = 0; i < parts_.size(); ++i)
      s += (i == 0 ? "" : ", ") + entries_[i].name + ": " + parts_[i]->held_out_size();
    return s;
  }
  std::vector<std::string> eval_part_names() const override {
    std::vector<std::string> names;
    for (const MixEntry& e : entries_) names.push_back(e.name);
    return names;
  }
  int64_t eval_part(int64_t index) const override { return index % static_cast<int64_t>(parts_.size()); }

 private:
  // The source of global sequence `sequence` of micro-batch `micro` of step `step`.
  size_t source_at(int64_t step, int64_t micro, int64_t sequence) const {
    const uint64_t key = hash3(mix_key_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro));
    const double u = uniform_at(seed_, key, static_cast<uint64_t>(sequence));
    size_t s = 0;
    for (double below = entries_[0].weight; s + 1 < entries_.size() && u >= below; below += entries_[++s].weight) {
    }
    return s;
  }

  // Per source, the draws that went to it before global sequence `sequence` of (step, micro):
  // every earlier micro-batch's global_batch draws, then this one's first `sequence`. The
  // counts at each micro-batch's start are kept, so that a run's next call only adds its own.
  std::vector<int64_t> taken_before(int64_t step, int64_t micro, int64_t sequence) const {
    ST_CHECK(step >= 1 && micro >= 0 && micro < micro_batches_ && sequence >= 0 && sequence < global_batch_,
             "data.mix: sequence ", sequence, " of micro-batch ", micro, " of step ", step, " is outside ",
             micro_batches_, " micro-batches of ", global_batch_, " sequences");
    const auto S = static_cast<int64_t>(parts_.size());
    const int64_t block = (step - 1) * micro_batches_ + micro;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (block_starts_.empty()) block_starts_.assign(static_cast<size_t>(S), 0);
    for (int64_t j = static_cast<int64_t>(block_starts_.size()) / S - 1; j < block; ++j) {
      std::vector<int64_t> next(block_starts_.end() - S, block_starts_.end());
      for (int64_t q = 0; q < global_batch_; ++q) ++next[source_at(j / micro_batches_ + 1, j % micro_batches_, q)];
      block_starts_.insert(block_starts_.end(), next.begin(), next.end());
    }
    std::vector<int64_t> counts(block_starts_.begin() + block * S, block_starts_.begin() + (block + 1) * S);
    for (int64_t q = 0; q < sequence; ++q) ++counts[source_at(step, micro, q)];
    return counts;
  }

  std::vector<MixEntry> entries_;
  std::vector<std::unique_ptr<data::TrainingData>> parts_;
  uint64_t seed_;
  const uint64_t mix_key_ = name_key("data mix");  // the draws' stream, hashed once
  int64_t global_batch_, micro_batches_;
  bool any_in_order_ = false;
  mutable std::mutex mutex_;
  mutable std::vector<int64_t> block_starts_;  // per micro-batch in order, each source's draws before it
};

}  // namespace

const char* const kDataTokenizerValues =
    "auto (model.hf's tokenizer.json, else the byte-level tokenizer), byte (the byte-level tokenizer: 256 bytes + "
    "BOS/EOS), or the path of a tokenizer.json or of the folder holding one";

TokenizerChoice choose_tokenizer(const DataSection& d, const std::string& hf) {
  namespace fs = std::filesystem;
  const std::string& t = d.tokenizer;
  if (t == "byte") return {"byte", "", "the byte-level tokenizer (data.tokenizer = byte)"};
  if (t != "auto") return {t, t, fmt::format("the tokenizer `{}` (data.tokenizer)", t)};
  if (hf.empty()) return {"byte", "", "the byte-level tokenizer (data.tokenizer = auto, and no model.hf)"};
  const fs::path json = fs::path(hf) / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(json, ec))
    return {hf, hf,
            fmt::format("the tokenizer `{}` (data.tokenizer = auto: model.hf's tokenizer.json)", json.string())};
  return {"byte", "",
          fmt::format("the byte-level tokenizer (data.tokenizer = auto, and model.hf `{}` holds no tokenizer.json; "
                      "another one: data.tokenizer = the path of a tokenizer.json)",
                      hf)};
}

std::unique_ptr<data::Tokenizer> load_chosen_tokenizer(const TokenizerChoice& choice) {
  return data::load_tokenizer(choice.spec, "`data.tokenizer`", kDataTokenizerValues);
}

std::unique_ptr<data::Tokenizer> make_tokenizer(const DataSection& data, const std::string& hf) {
  return load_chosen_tokenizer(choose_tokenizer(data, hf));
}

namespace {

// open_training_data with training.seq_len chosen, and the examples read ahead to choose it.
std::unique_ptr<data::TrainingData> open_sources(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                 int64_t model_vocab, int64_t world, dist::Communicator* comm,
                                                 int local_rank, ExampleCache* cache) {
  if (!config.data.mix.empty()) {
    ST_CHECK(config.data.eval_source.empty(), "`data.mix` evaluates each source on its own held-out split; "
             "`data.eval_source` does not apply beside it");
    std::vector<MixEntry> entries = parse_data_mix(config.data.mix);
    std::vector<std::unique_ptr<data::TrainingData>> parts;
    for (const MixEntry& e : entries) {
      JobConfig one = config;
      one.data.mix.clear();
      one.data.source = e.source;
      parts.push_back(with_context([&] { return "`data.mix` source `" + e.source + "`"; },
                                   [&] { return open_source(one, tokenizer, model_vocab, world, comm, local_rank,
                                                            cache, "data.mix"); }));
    }
    return std::make_unique<MixedData>(std::move(entries), std::move(parts), config.training.seed,
                                       config.training.batch_size * world, config.training.grad_accum_steps);
  }
  if (config.data.eval_source.empty())
    return open_source(config, tokenizer, model_vocab, world, comm, local_rank, cache);
  // the training source whole, and the evaluation source whole as the held-out split
  JobConfig train = config;
  train.data.val_fraction = 0;
  JobConfig eval = config;
  eval.data.source = config.data.eval_source;
  eval.data.val_fraction = 1;
  // data.format applies to both: examples beside examples of the same format, documents (of
  // any of their forms when it is auto) beside documents
  auto train_data = open_source(train, tokenizer, model_vocab, world, comm, local_rank, cache);
  auto eval_data = with_context([&] { return "reading `data.eval_source` = `" + eval.data.source + "`"; },
                                [&] {
                                  return open_source(eval, tokenizer, model_vocab, world, comm, local_rank, cache,
                                                     "data.eval_source");
                                });
  return std::make_unique<TrainEvalData>(std::move(train_data), std::move(eval_data));
}

}  // namespace

std::unique_ptr<data::TrainingData> open_training_data(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                       int64_t model_vocab, int64_t world, dist::Communicator* comm,
                                                       int local_rank, AutoSeqLen* seq_len) {
  if (config.training.seq_len > 0) return open_sources(config, tokenizer, model_vocab, world, comm, local_rank, nullptr);
  ST_CHECK(seq_len != nullptr, "`training.seq_len` = 0 (auto) is chosen when a run starts, from the model's context; "
           "give a length here");
  // Every source of examples is read (tokenized) now, once, and measured before it is packed;
  // documents are not measured, which would take a pass of its own over data of any size.
  std::vector<std::pair<std::string, std::string>> sources;  // (source, the key it came from)
  if (!config.data.mix.empty()) {
    for (const MixEntry& e : parse_data_mix(config.data.mix)) sources.emplace_back(e.source, "data.mix");
  } else {
    sources.emplace_back(config.data.source, "data.source");
    if (!config.data.eval_source.empty()) sources.emplace_back(config.data.eval_source, "data.eval_source");
  }
  ExampleCache cache;
  int64_t longest = 0;
  for (const auto& [source, key] : sources) {
    DataSection d = config.data;
    d.source = source;
    const std::string format = resolve_data_format(d, key);
    if ((format != "sft" && format != "chat") || cache.count(source) > 0) continue;
    LoadedExamples loaded = load_examples(d, format, tokenizer, model_vocab, sft_options(config, format, world), comm,
                                          local_rank);
    for (const data::SftExample& e : loaded.examples) longest = std::max(longest, static_cast<int64_t>(e.ids.size()));
    cache.emplace(source, std::move(loaded));
  }
  seq_len->chosen = auto_seq_len(seq_len->model_max_seq_len, longest);
  JobConfig resolved = config;
  resolved.training.seq_len = seq_len->chosen.seq_len;
  return open_sources(resolved, tokenizer, model_vocab, world, comm, local_rank, &cache);
}

namespace {

std::unique_ptr<data::TrainingData> open_source(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                int64_t model_vocab, int64_t world, dist::Communicator* comm,
                                                int local_rank, ExampleCache* cache, const std::string& key) {
  const DataSection& d = config.data;
  const TrainingSection& t = config.training;
  const std::string format = resolve_data_format(d, key);
  if (format == "random") return std::make_unique<data::RandomTokenData>(model_vocab, t.seed);
  if (format == "tokens") {
    return data::open_token_file_data(d.source, tokenizer, model_vocab, d.val_fraction, t.seq_len, t.seed);
  }
  if (format == "sft" || format == "chat")
    return open_examples(d, format, tokenizer, model_vocab, sft_options(config, format, world), comm, local_rank,
                         cache);
  if (auto cached = open_document_cache(d, format, tokenizer, model_vocab, t, comm, local_rank)) return cached;
  data::TokenStreams streams;
  if (d.source == "builtin:fortunes") {
    streams = data::build_token_streams(data::load_fortunes(), tokenizer, d.val_fraction, t.seed);
  } else {
    data::DocumentReader reader(d.source, data::parse_document_format(format), d.text_field);
    streams = data::build_token_streams(reader, tokenizer, d.val_fraction, t.seed, true);
  }
  std::string summary = fmt::format("{} documents, {:.2f} MB of text -> {} training / {} held-out tokens ({})",
                                    streams.documents, static_cast<double>(streams.bytes) / 1e6,
                                    streams.train.size(), streams.val.size(), d.source);
  return std::make_unique<data::PackedStreamData>(
      std::make_unique<data::VectorTokenSource>(std::move(streams.train)),
      std::make_unique<data::VectorTokenSource>(std::move(streams.val)), t.seq_len, t.seed, std::move(summary),
      d.val_fraction >= 1);
}

}  // namespace

}  // namespace shardtrain::train
