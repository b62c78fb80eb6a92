// `shardtrain tokenize`'s speed (data::tokenize_file) with the next block read on a thread of
// its own (read_ahead) and without, on every OpenMP thread, for a JSONL file plain and gzipped
// (the decompression then is the serial part). The input is a corpus's lines as JSONL
// documents, repeated to the size asked; both settings must write the same token file.
// Usage:
//   tokenize_file_bench tokenizer.json corpus.txt [megabytes = 256] [rounds = 2]
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

namespace fs = std::filesystem;
using namespace shardtrain;

// The corpus's non-empty lines as {"text": line} rows, repeated until `bytes`.
void write_jsonl(const std::string& corpus, const fs::path& out, size_t bytes) {
  std::vector<std::string> rows;
  std::istringstream lines(corpus);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) rows.push_back(nlohmann::json({{"text", line}}).dump() + "\n");
  ST_CHECK(!rows.empty(), "the corpus has no lines");
  std::ofstream f(out, std::ios::binary);
  size_t written = 0;
  for (size_t i = 0; written < bytes; i = (i + 1) % rows.size()) {
    f << rows[i];
    written += rows[i].size();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s tokenizer.json corpus.txt [megabytes = 256] [rounds = 2]\n", argv[0]);
    return 2;
  }
  const size_t megabytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 256;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 2;
  const data::BpeTokenizer tokenizer(argv[1]);
  const fs::path dir = fs::temp_directory_path() / ("tokenize_file_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path jsonl = dir / "corpus.jsonl";
  write_jsonl(io::InputFile(argv[2]).read_all(), jsonl, megabytes << 20);
  const std::string gzip = "gzip -1 -k -c " + jsonl.string() + " > " + (dir / "corpus.jsonl.gz").string();
  ST_CHECK(std::system(gzip.c_str()) == 0, "`", gzip, "` failed");
  std::printf("%zu MB of JSONL rows from %s, %d threads, the best of %d rounds\n\n", megabytes, argv[2],
              omp_get_max_threads(), rounds);
  std::printf("| input | read between blocks | read ahead | speed-up |\n|---|---|---|---|\n");
  for (const char* name : {"corpus.jsonl", "corpus.jsonl.gz"}) {
    double best[2] = {0, 0};
    std::string written[2];
    for (int round = 0; round < rounds; ++round)
      for (int ahead = 0; ahead < 2; ++ahead) {
        data::TokenizeFileOptions o;
        o.format = data::TextFormat::kJsonl;
        o.read_ahead = ahead == 1;
        const fs::path out = dir / (std::string(ahead ? "ahead" : "between") + ".tok");
        const data::TokenizeFileStats st = data::tokenize_file(tokenizer, (dir / name).string(), out.string(), o);
        best[ahead] = std::max(best[ahead], st.bytes_per_second() / 1e6);
        if (round == 0) written[ahead] = io::InputFile(out.string()).read_all();
      }
    ST_CHECK(written[0] == written[1], name, ": the two settings wrote different token files");
    std::printf("| %s | %.1f MB/s | %.1f MB/s | %.2fx |\n", name, best[0], best[1], best[1] / best[0]);
  }
  fs::remove_all(dir);
  return 0;
}
