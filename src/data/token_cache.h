// A token cache: a source tokenized once into a folder, which later launches, and every rank
// of a launch, read instead of tokenizing the source again. Documents (text, JSONL, Parquet)
// are kept as the streams the in-memory path builds (the same documents in the same order,
// held out by the same seeded hash), fine-tuning examples as the examples SftData packs, so
// training reads the same batches either way.
//
// Layout of a cache folder (`<cache_dir>/<source name>-<16 hex digits>`):
//   documents (text, jsonl, parquet): train.tok and val.tok, the training and held-out
//     documents as token files (data/tokenize_file.h)
//   examples (sft, chat): examples.bin, every example tokenized with its loss mask, in file
//     order (an example file, data/sft.h); the split and packing happen at each launch
//   source.json: what it was made from (the key below, each file's size and time) and counts,
//     written last
// A folder is written under a temporary name and renamed into place when whole, so a folder
// with its final name is complete; when two processes build one at once, the first rename
// wins and the other's copy is removed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/corpus.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

// Everything the cached tokens depend on besides the tokenizer. The source's files enter the
// folder's name by path, size and modification time, so an edited file gets a new folder.
struct TokenCacheKey {
  std::string source;  // a file, or for Parquet also a folder or pattern
  std::string format;  // text, jsonl, parquet (documents) or sft, chat (examples)
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();  // fields, split, ...
};

// A document source and the split of its streams: what they depend on besides the tokenizer.
struct DocumentSource {
  std::string source;
  DocumentFormat format = DocumentFormat::kText;
  std::string field;  // JSONL's field, Parquet's column (unused for text)
  double val_fraction = 0.05;
  uint64_t seed = 0;
};
TokenCacheKey document_cache_key(const DocumentSource& documents);

// The source's files (as DocumentReader reads them) and their total size on disk.
std::vector<std::string> token_cache_source_files(const TokenCacheKey& key);
uint64_t token_cache_source_bytes(const TokenCacheKey& key);

// $XDG_CACHE_HOME/shardtrain/tokens, else $HOME/.cache/shardtrain/tokens; empty with neither.
std::string default_token_cache_dir();

// The folder under `cache_dir` that holds `key` tokenized by `tokenizer` (whose fingerprint
// must not be empty).
std::string token_cache_folder(const std::string& cache_dir, const TokenCacheKey& key, const Tokenizer& tokenizer);

// Whether `folder` is a complete cache (its source.json, written last, is there).
bool token_cache_complete(const std::string& folder);

// Builds `folder`: write(tmp) fills a temporary folder beside it and returns the counts for
// source.json, which is written after them; the folder is then renamed into place. Returns
// false when another process completed `folder` first (its copy is kept, ours removed). A
// failed write leaves nothing behind.
bool build_cache_folder(const std::string& folder, const TokenCacheKey& key, const Tokenizer& tokenizer,
                        const std::function<nlohmann::ordered_json(const std::string& tmp)>& write);

// source.json of a complete folder.
nlohmann::ordered_json read_cache_info(const std::string& folder);

// Marks a cache folder as read now (its modification time, which `shardtrain cache` reports as
// its last use and `prune --unused-days` goes by). Best effort: a read-only folder stays as is.
void mark_token_cache_used(const std::string& folder);

// A folder of a token cache directory, as `shardtrain cache` lists and prunes them. Only
// folders named as caches are (`<stem>-<16 hex digits>`, and `....tmp-<host>-<pid>` for a build
// under way); anything else in the directory is left alone.
struct TokenCacheEntry {
  enum class State {
    kCurrent,    // complete, and every source file it recorded is as it was
    kStale,      // complete, but a source file it recorded changed or is gone: no launch reads it again
    kDamaged,    // a cache's name without a readable source.json: no launch can read or rebuild it
    kBuilding,   // a build's temporary folder whose process runs on this machine
    kAbandoned,  // a build's temporary folder whose process (on this machine) is gone
    kElsewhere,  // a build's temporary folder from another machine: running there or not, unknown here
  };
  std::string path;
  State state = State::kCurrent;
  std::string detail;           // what changed, which process builds it, why it is damaged
  int64_t bytes = 0;            // its files' sizes
  double idle_seconds = 0;      // since its last use (complete folders) or last write (temporary ones)
  nlohmann::ordered_json info;  // source.json (complete folders)
};
const char* token_cache_state_name(TokenCacheEntry::State state);

// The cache folders in `dir`, by name; none when `dir` does not exist.
std::vector<TokenCacheEntry> scan_token_cache_dir(const std::string& dir);

// Which folders `shardtrain cache prune` removes: always the stale, damaged and abandoned ones;
// with `unused_days` (>= 0) also current folders and other machines' temporary ones idle that
// long; with `all` every one. Never a build still running on this machine.
struct TokenCachePrune {
  double unused_days = -1;
  bool all = false;
};
bool token_cache_prunable(const TokenCacheEntry& entry, const TokenCachePrune& prune);

struct TokenCacheStats {
  int64_t documents = 0;
  uint64_t text_bytes = 0;
  uint64_t train_tokens = 0, val_tokens = 0;
  double seconds = 0;
  bool built = false;  // false: another process completed the folder first, and its copy is kept
};

// Tokenizes a document source into `folder` (its document_cache_key's): train.tok and
// val.tok, a block of documents at a time on every core; logs progress every 10 s when
// `progress`. Errors name the source.
TokenCacheStats build_token_cache(const std::string& folder, const DocumentSource& documents,
                                  const Tokenizer& tokenizer, bool progress);

}  // namespace shardtrain::data
