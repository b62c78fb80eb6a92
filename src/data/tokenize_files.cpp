// Token files made with a log of each (data/tokenize_file.h): one file, or many several at a
// time, a pool of workers taking the inputs in order, each with its share of the threads.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenize_file.h"

namespace shardtrain::data {

TokenizeFileStats tokenize_file_logged(const Tokenizer& tokenizer, const std::string& input_path,
                                       const std::string& output_path, TokenizeFileOptions options,
                                       std::optional<TextFormat> format, const std::string& tag) {
  static const char* const kFormatNames[] = {"lines", "whole", "jsonl", "parquet"};  // TextFormat's order
  options.format = format ? *format : detect_text_format(input_path);
  if (!format)
    log::info(fmt::format("tokenize: {}reading `{}` as {} (--format)", tag, input_path,
                          kFormatNames[static_cast<int>(options.format)]));
  const TokenizeFileStats st = tokenize_file(tokenizer, input_path, output_path, options);
  log::info(fmt::format("tokenize: {}{} documents, {} tokens from {:.1f} MB in {:.2f} s ({:.1f} MB/s) -> {}", tag,
                        st.documents, st.tokens, static_cast<double>(st.input_bytes) / 1e6, st.seconds,
                        st.bytes_per_second() / 1e6, output_path));
  return st;
}

TokenizeFilesStats tokenize_files(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                                  const std::string& out_dir, const TokenizeFilesOptions& options) {
  ST_CHECK(options.files_at_once >= 0, "tokenize: files at once must be >= 0 (0: auto), found ",
           options.files_at_once);
  const auto start = std::chrono::steady_clock::now();
  const int threads = options.file.num_threads > 0 ? options.file.num_threads : omp_get_max_threads();
  const auto n = static_cast<int>(inputs.size());
  const int workers = std::clamp(options.files_at_once > 0 ? options.files_at_once : threads / 8, 1, std::max(n, 1));
  TokenizeFileOptions per_file = options.file;
  per_file.num_threads = std::max(1, threads / workers);
  std::filesystem::create_directories(out_dir);
  if (workers > 1)
    log::info(fmt::format("tokenize: {} files at once, {} thread{} each", workers, per_file.num_threads,
                          per_file.num_threads == 1 ? "" : "s"));

  std::mutex mutex;  // guards stats and the first error
  TokenizeFilesStats stats;
  std::exception_ptr error;
  int error_index = n;
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i; (i = next.fetch_add(1)) < n;) {
      {
        const std::lock_guard lock(mutex);
        if (error) return;  // no new file after an error
      }
      const std::string& in = inputs[static_cast<size_t>(i)];
      const std::string out = (std::filesystem::path(out_dir) / token_file_name(in)).string();
      const std::string tag = n > 1 ? fmt::format("[{}/{}] ", i + 1, n) : std::string();
      try {
        // a token file is complete once it has its name (written under another, then renamed);
        // one made with this tokenizer is kept
        if (options.skip_existing && is_token_file(out)) {
          const TokenFile done(out);
          const TokenFileHeader& h = done.header();
          if (h.vocab_size == tokenizer.vocab_size() && h.eos_id == tokenizer.eos_id() &&
              h.bos_id == tokenizer.bos_id()) {
            log::info(fmt::format("tokenize: {}`{}` exists ({} documents, {} tokens): skipped (--skip-existing)", tag,
                                  out, h.document_count, h.token_count));
            const std::lock_guard lock(mutex);
            stats.documents += h.document_count;
            stats.tokens += h.token_count;
            ++stats.skipped;
            continue;
          }
        }
        const TokenizeFileStats st = tokenize_file_logged(tokenizer, in, out, per_file, options.format, tag);
        const std::lock_guard lock(mutex);
        stats.documents += st.documents;
        stats.tokens += st.tokens;
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (i < error_index) {
          error_index = i;
          error = std::current_exception();
        }
      }
    }
  };
  if (workers == 1) {
    work();
  } else {
    std::vector<std::jthread> pool;
    for (int w = 0; w < workers; ++w) pool.emplace_back(work);
  }  // joined here
  if (error) std::rethrow_exception(error);
  stats.files = inputs.size();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace shardtrain::data
