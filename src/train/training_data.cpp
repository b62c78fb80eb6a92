// Opening a job's training data; the loaders and samplers themselves live in data/.
#include "train/training_data.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/corpus.h"
#include "data/sft.h"
#include "data/tokenize_file.h"
#include "io/input_file.h"
#include "io/parquet.h"

namespace shardtrain::train {
namespace {

std::vector<std::string> load_documents(const DataSection& d, const std::string& format) {
  if (d.source == "builtin:fortunes") return data::load_fortunes();
  if (format == "parquet") return data::load_parquet_documents(d.source, d.text_field);
  return format == "jsonl" ? data::load_jsonl_documents(d.source, d.text_field) : data::load_text_documents(d.source);
}

}  // namespace

std::string resolve_data_format(const DataSection& d) {
  ST_CHECK(d.source.rfind("builtin:", 0) != 0 || d.source == "builtin:fortunes", "`data.source`: unknown built-in "
           "corpus `", d.source, "`; the built-in one is builtin:fortunes");
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
      ST_CHECK(d.format == "auto" || d.format == "tokens", "`data.source` = `", d.source, "` names token files, which "
               "are read as such, not as `data.format` = ", d.format);
      return "tokens";
    }
    const bool parquet = std::any_of(files.begin(), files.end(), [](const std::string& f) { return io::is_parquet_file(f); });
    ST_CHECK(parquet, "`data.source` = `", d.source, "` names ", files.size(), " files, none of them a token file ("
             "written by `shardtrain tokenize`) or a Parquet file");
    ST_CHECK(d.format == "auto" || d.format == "parquet" || d.format == "sft" || d.format == "chat", "`data.source` = `",
             d.source, "` names Parquet files, which read as `data.format` = parquet, sft or chat, not ", d.format);
    return d.format == "auto" ? "parquet" : d.format;
  }
  ST_CHECK(std::filesystem::is_regular_file(d.source), "`data.source`: no file or folder `", d.source, "`");
  if (io::is_parquet_file(d.source)) {
    ST_CHECK(d.format == "auto" || d.format == "parquet" || d.format == "sft" || d.format == "chat",
             "`data.source` = `", d.source, "` is a Parquet file, which reads as `data.format` = parquet (documents in "
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
  const std::string format = resolve_data_format(d);
  return (format == "sft" || format == "chat") && d.packing;
}

std::unique_ptr<data::TrainingData> open_training_data(const JobConfig& config, const data::Tokenizer& tokenizer,
                                                       int64_t model_vocab, int64_t world) {
  const DataSection& d = config.data;
  const TrainingSection& t = config.training;
  const std::string format = resolve_data_format(d);
  if (format == "tokens") {
    return data::open_token_file_data(d.source, tokenizer, model_vocab, d.val_fraction, t.seq_len, t.seed);
  }
  if (format == "sft" || format == "chat") {
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
    return std::make_unique<data::SftData>(d.source, tokenizer, o);
  }
  const std::vector<std::string> docs = load_documents(d, format);
  data::TokenStreams streams = data::build_token_streams(docs, tokenizer, d.val_fraction, t.seed);
  std::string summary = fmt::format("{} documents, {:.2f} MB of text -> {} training / {} held-out tokens ({})",
                                    streams.documents, static_cast<double>(streams.bytes) / 1e6,
                                    streams.train.size(), streams.val.size(), d.source);
  return std::make_unique<data::PackedStreamData>(
      std::make_unique<data::VectorTokenSource>(std::move(streams.train)),
      std::make_unique<data::VectorTokenSource>(std::move(streams.val)), t.seq_len, t.seed, std::move(summary));
}

}  // namespace shardtrain::train
