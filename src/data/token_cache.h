// A token cache: a text, JSONL or Parquet source tokenized once into a folder of token files,
// which later launches, and every rank of a launch, map instead of tokenizing the source
// again. The folder holds the same streams the in-memory path builds (the same documents in
// the same order, held out by the same seeded hash), so training reads the same batches
// either way.
//
// Layout of a cache folder (`<cache_dir>/<source name>-<16 hex digits>`):
//   train.tok    the training documents, a token file (data/tokenize_file.h)
//   val.tok      the held-out documents
//   source.json  what it was made from (the key below, each file's size and time) and counts
// A folder is written under a temporary name and renamed into place when whole, so a folder
// with its final name is complete; when two processes build one at once, the first rename
// wins and the other's copy is removed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

// Everything the streams depend on. The source's files enter the folder's name by path, size
// and modification time, so an edited file gets a new folder.
struct TokenCacheKey {
  std::string source;  // a file, or for Parquet also a folder or pattern
  DocumentFormat format = DocumentFormat::kText;
  std::string field;  // JSONL's field, Parquet's column (unused for text)
  double val_fraction = 0.05;
  uint64_t seed = 0;
};

// The source's files (as DocumentReader reads them) and their total size on disk.
std::vector<std::string> token_cache_source_files(const TokenCacheKey& key);
uint64_t token_cache_source_bytes(const TokenCacheKey& key);

// $XDG_CACHE_HOME/shardtrain/tokens, else $HOME/.cache/shardtrain/tokens; empty with neither.
std::string default_token_cache_dir();

// The folder under `cache_dir` that holds `key` tokenized by `tokenizer` (whose fingerprint
// must not be empty).
std::string token_cache_folder(const std::string& cache_dir, const TokenCacheKey& key, const Tokenizer& tokenizer);

// Whether `folder` is a complete cache (its three files present).
bool token_cache_complete(const std::string& folder);

struct TokenCacheStats {
  int64_t documents = 0;
  uint64_t text_bytes = 0;
  uint64_t train_tokens = 0, val_tokens = 0;
  double seconds = 0;
  bool built = false;  // false: another process completed the folder first, and its copy is kept
};

// Tokenizes the source into `folder` (created with its parents), a block of documents at a
// time on every core; logs progress every 10 s when `progress`. Errors name the source; a
// failed build leaves no folder behind.
TokenCacheStats build_token_cache(const std::string& folder, const TokenCacheKey& key, const Tokenizer& tokenizer,
                                  bool progress);

}  // namespace shardtrain::data
