// Encoding throughput of BpeTokenizer on a corpus: one document per line, with 1 thread and
// with N (OpenMP), after checking golden ids. Usage:
//   tokenizer_bench [corpus.txt] [tokenizer.json] [threads]
// Defaults: the bible corpus and the Llama 3 tokenizer in ../shared/data, all OpenMP threads.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenize_file.h"
#include "io/input_file.h"

namespace {

using shardtrain::data::BpeTokenizer;

std::string shared_data_dir() {
  if (const char* env = std::getenv("SHARDTRAIN_SHARED_DATA")) return env;
  // bench/data/tokenizer_bench.cpp -> <repo>/../shared/data
  return (std::filesystem::path(__FILE__).parent_path() / "../../../shared/data")
      .lexically_normal()
      .string();
}

// The golden cases beside the default tokenizer, when present; throws on any difference.
void validate(const BpeTokenizer& tokenizer, const std::string& golden_path) {
  std::ifstream in(golden_path);
  if (!in.good()) {
    std::printf("validation: %s not found, skipped\n", golden_path.c_str());
    return;
  }
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::vector<int32_t> expected = j.at("ids").get<std::vector<int32_t>>();
    ST_CHECK(tokenizer.encode(j.at("text").get<std::string>()) == expected,
             "validation failed on case ", cases, " of `", golden_path, "`");
    ++cases;
  }
  std::printf("validation: %d golden cases of %s equal\n", cases, golden_path.c_str());
}

// Seconds to encode every line with `threads` threads (best of `repeats`); total tokens.
double time_encode(const BpeTokenizer& tokenizer, const std::vector<std::string_view>& lines,
                   int threads, int repeats, size_t& tokens) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    size_t count = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : count)
    {
      std::vector<int32_t> ids;
#pragma omp for schedule(dynamic, 256)
      for (size_t i = 0; i < lines.size(); ++i) {
        ids.clear();
        tokenizer.encode_append(lines[i], ids);
        count += ids.size();
      }
    }
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    tokens = count;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string shared = shared_data_dir();
    const std::string corpus = argc > 1 ? argv[1] : shared + "/corpus/world_english_bible.txt";
    const std::string tokenizer_path =
        argc > 2 ? argv[2] : shared + "/tokenizers/llama3/tokenizer.json";
    const int threads = argc > 3 ? std::atoi(argv[3]) : omp_get_max_threads();
    ST_CHECK(threads >= 1, "threads: expected >= 1, found ", argv[3]);

    auto start = std::chrono::steady_clock::now();
    const BpeTokenizer tokenizer(tokenizer_path);
    std::printf("tokenizer: %s (vocab %lld), loaded in %.2f s\n", tokenizer_path.c_str(),
                static_cast<long long>(tokenizer.vocab_size()),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (argc <= 2) validate(tokenizer, shared + "/tokenizer_tests/llama3_golden_edge.jsonl");
    if (argc <= 2) validate(tokenizer, shared + "/tokenizer_tests/llama3_golden_web.jsonl");

    const std::string text = shardtrain::io::InputFile(corpus).read_all();
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      lines.emplace_back(text.data() + pos, end - pos);
      pos = end + 1;
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("corpus: %s, %.2f MB, %zu lines\n", corpus.c_str(), mb, lines.size());

    size_t tokens = 0;
    // The first pass also fills the BPE cache of pre-tokens that are not vocab entries.
    const double cold = time_encode(tokenizer, lines, 1, 1, tokens);
    std::printf("encode,  1 thread(s), cold cache: %.3f s, %.1f MB/s\n", cold, mb / cold);
    for (int t : {1, threads}) {
      const double seconds = time_encode(tokenizer, lines, t, 3, tokens);
      std::printf(
          "encode, %2d thread(s): %.3f s, %zu tokens, %.1f MB/s total, %.1f MB/s per core\n", t,
          seconds, tokens, mb / seconds, mb / seconds / t);
      if (threads == 1) break;
    }

    // End to end: file -> token file (reading, encoding in parallel, writing).
    const std::string out =
        (std::filesystem::temp_directory_path() / "shardtrain_tokenizer_bench.sttok").string();
    for (int t : {1, threads}) {
      shardtrain::data::TokenizeFileOptions options;
      options.num_threads = t;
      const shardtrain::data::TokenizeFileStats stats =
          shardtrain::data::tokenize_file(tokenizer, corpus, out, options);
      std::printf("tokenize_file, %2d thread(s): %.3f s, %llu documents, %llu tokens, %.1f MB/s\n",
                  t, stats.seconds, static_cast<unsigned long long>(stats.documents),
                  static_cast<unsigned long long>(stats.tokens), stats.bytes_per_second() / 1e6);
      if (threads == 1) break;
    }
    std::filesystem::remove(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
