// Token caches: a source tokenized once into train.tok / val.tok (data/token_cache.h).
#include "data/token_cache.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host.h"
#include "core/random.h"
#include "data/dataset.h"
#include "data/sft.h"
#include "data/tokenize_file.h"

namespace shardtrain::data {
namespace fs = std::filesystem;
namespace {

struct FileStamp {
  std::string path;  // absolute
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

FileStamp stamp(const std::string& path) {
  std::error_code ec;
  FileStamp s;
  s.path = fs::absolute(path, ec).lexically_normal().string();
  if (ec) s.path = path;
  s.bytes = fs::file_size(path, ec);
  ST_CHECK(!ec, "`", path, "`: cannot read its size: ", ec.message());
  const auto t = fs::last_write_time(path, ec);
  ST_CHECK(!ec, "`", path, "`: cannot read its modification time: ", ec.message());
  s.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  return s;
}

// The key as JSON: what source.json records and what the folder name hashes.
nlohmann::ordered_json key_json(const TokenCacheKey& key, const Tokenizer& tokenizer) {
  nlohmann::ordered_json j;
  j["cache_version"] = 1;
  j["source"] = key.source;
  j["format"] = key.format;
  j["settings"] = key.settings;
  j["tokenizer"] = tokenizer.fingerprint();
  j["vocab_size"] = tokenizer.vocab_size();
  j["bos_id"] = tokenizer.bos_id();
  j["eos_id"] = tokenizer.eos_id();
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const std::string& f : token_cache_source_files(key)) {
    const FileStamp s = stamp(f);
    files.push_back({{"path", s.path}, {"bytes", s.bytes}, {"mtime_ns", s.mtime_ns}});
  }
  j["files"] = std::move(files);
  return j;
}

// A readable stem for the folder: the source's name, in [A-Za-z0-9._-], at most 48 characters.
std::string source_stem(const TokenCacheKey& key) {
  std::string name = source_name(key.source);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  if (name[0] == '.') name = "source" + name;
  if (name.size() > 48) name.resize(48);
  return name;
}

// Removes a temporary folder unless released.
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    if (path.empty()) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TokenCacheKey document_cache_key(const DocumentSource& d) {
  TokenCacheKey key{d.source, document_format_name(d.format), nlohmann::ordered_json::object()};
  key.settings["field"] = d.format == DocumentFormat::kText ? "" : d.field;
  key.settings["val_fraction"] = fmt::format("{:.17g}", d.val_fraction);  // exact
  key.settings["seed"] = d.seed;
  return key;
}

std::vector<std::string> token_cache_source_files(const TokenCacheKey& key) {
  if (key.format == "sft" || key.format == "chat") return example_files(key.source).files;
  return document_files(key.source, parse_document_format(key.format));
}

uint64_t token_cache_source_bytes(const TokenCacheKey& key) {
  uint64_t total = 0;
  for (const std::string& f : token_cache_source_files(key)) total += stamp(f).bytes;
  return total;
}

std::string default_token_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return (fs::path(xdg) / "shardtrain" / "tokens").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return (fs::path(home) / ".cache" / "shardtrain" / "tokens").string();
  return {};
}

std::string token_cache_folder(const std::string& cache_dir, const TokenCacheKey& key, const Tokenizer& tokenizer) {
  ST_CHECK(!tokenizer.fingerprint().empty(), "a token cache needs a tokenizer that names what it encodes by; this "
           "one does not (set data.token_cache = off)");
  const uint64_t hash = name_key(key_json(key, tokenizer).dump());
  return (fs::path(cache_dir) / fmt::format("{}-{:016x}", source_stem(key), hash)).string();
}

bool token_cache_complete(const std::string& folder) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(folder) / "source.json", ec);
}

bool build_cache_folder(const std::string& folder, const TokenCacheKey& key, const Tokenizer& tokenizer,
                        const std::function<nlohmann::ordered_json(const std::string& tmp)>& write) {
  nlohmann::ordered_json info = key_json(key, tokenizer);
  const fs::path final_path(folder);
  std::error_code ec;
  fs::create_directories(final_path.parent_path(), ec);
  ST_CHECK(!ec, "token cache: cannot create the folder `", final_path.parent_path().string(), "`: ", ec.message(),
           " (set data.cache_dir to a writable folder, or data.token_cache = off)");
  RemoveOnExit tmp{fmt::format("{}.tmp-{}-{}", folder, host_name(), ::getpid())};
  fs::remove_all(tmp.path, ec);
  fs::create_directory(tmp.path, ec);
  ST_CHECK(!ec, "token cache: cannot create `", tmp.path, "`: ", ec.message());
  info.update(write(tmp.path));
  {
    const std::string path = (fs::path(tmp.path) / "source.json").string();
    std::ofstream out(path);
    out << info.dump(2) << "\n";
    out.close();
    ST_CHECK(out.good(), "token cache: writing `", path, "` failed");
  }
  // a folder another process completed meanwhile stays; ours is then removed on the way out
  if (::rename(tmp.path.c_str(), folder.c_str()) == 0) {
    tmp.path.clear();
    return true;
  }
  const int error = errno;
  ST_CHECK(token_cache_complete(folder), "token cache: renaming `", tmp.path, "` to `", folder, "`: ",
           std::strerror(error));
  return false;
}

nlohmann::ordered_json read_cache_info(const std::string& folder) {
  const std::string path = (fs::path(folder) / "source.json").string();
  std::ifstream in(path);
  ST_CHECK(in.good(), "token cache: cannot open `", path, "`");
  try {
    return nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    ST_THROW("token cache `", path, "`: unreadable (", e.what(), "); remove the folder `", folder,
             "` to rebuild it");
  }
}

void mark_token_cache_used(const std::string& folder) {
  std::error_code ec;
  fs::last_write_time(folder, fs::file_time_type::clock::now(), ec);  // a read-only folder: not recorded
}

const char* token_cache_state_name(TokenCacheEntry::State state) {
  switch (state) {
    case TokenCacheEntry::State::kCurrent: return "current";
    case TokenCacheEntry::State::kStale: return "stale";
    case TokenCacheEntry::State::kDamaged: return "damaged";
    case TokenCacheEntry::State::kBuilding: return "building";
    case TokenCacheEntry::State::kAbandoned: return "abandoned";
    case TokenCacheEntry::State::kElsewhere: return "elsewhere";
  }
  return "?";
}

namespace {

// The sizes of the files under `folder`; unreadable entries count nothing.
int64_t folder_bytes(const fs::path& folder) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(folder, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uintmax_t n = it->file_size(size_ec);
      if (!size_ec) total += static_cast<int64_t>(n);
    }
  }
  return total;
}

// Why a complete folder's source.json no longer describes its source ("" while it does), or
// throws when source.json does not say what it was made from.
std::string stale_reason(const nlohmann::ordered_json& info) {
  const int version = info.at("cache_version").get<int>();
  if (version != 1) return fmt::format("made as cache version {}; this shardtrain writes and reads version 1", version);
  for (const auto& f : info.at("files")) {
    const std::string path = f.at("path").get<std::string>();
    std::error_code ec;
    if (!fs::exists(path, ec)) return fmt::format("its source file `{}` is gone", path);
    try {
      const FileStamp now = stamp(path);
      if (now.bytes != f.at("bytes").get<uint64_t>() || now.mtime_ns != f.at("mtime_ns").get<int64_t>())
        return fmt::format("its source file `{}` changed after the build", path);
    } catch (const Error&) {
      return fmt::format("its source file `{}` cannot be read", path);
    }
  }
  return {};
}

bool process_alive(long pid) {
  if (pid <= 0 || pid != static_cast<pid_t>(pid)) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;  // EPERM: alive, another user's
}

}  // namespace

std::vector<TokenCacheEntry> scan_token_cache_dir(const std::string& dir) {
  std::vector<TokenCacheEntry> entries;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return entries;
  static const std::regex complete_name(R"(.+-[0-9a-f]{16})");
  static const std::regex temporary_name(R"((.+-[0-9a-f]{16})\.tmp-(.+)-([0-9]+))");
  const auto now = fs::file_time_type::clock::now();
  const std::string this_host = host_name();
  fs::directory_iterator it(dir, ec);
  ST_CHECK(!ec, "token cache directory `", dir, "`: cannot list it: ", ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    ST_CHECK(!ec, "token cache directory `", dir, "`: cannot list it: ", ec.message());
    std::error_code entry_ec;
    if (!it->is_directory(entry_ec) || it->is_symlink(entry_ec)) continue;
    const std::string name = it->path().filename().string();
    std::smatch m;
    TokenCacheEntry e;
    e.path = it->path().string();
    if (std::regex_match(name, m, temporary_name)) {
      const std::string host = m[2].str();
      const long pid = std::strtol(m[3].str().c_str(), nullptr, 10);
      if (host != this_host) {
        e.state = TokenCacheEntry::State::kElsewhere;
        e.detail = fmt::format("a build by process {} on the machine `{}`", pid, host);
      } else if (process_alive(pid)) {
        e.state = TokenCacheEntry::State::kBuilding;
        e.detail = fmt::format("a build by process {} on this machine, still running", pid);
      } else {
        e.state = TokenCacheEntry::State::kAbandoned;
        e.detail = fmt::format("a build by process {} on this machine, which is gone", pid);
      }
    } else if (std::regex_match(name, complete_name)) {
      if (!token_cache_complete(e.path)) {
        e.state = TokenCacheEntry::State::kDamaged;
        e.detail = "no source.json";
      } else {
        try {
          e.info = read_cache_info(e.path);
          e.detail = stale_reason(e.info);
          e.state = e.detail.empty() ? TokenCacheEntry::State::kCurrent : TokenCacheEntry::State::kStale;
        } catch (const std::exception& error) {  // unparsable, or a field missing or of the wrong type
          e.state = TokenCacheEntry::State::kDamaged;
          e.detail = fmt::format("source.json does not say what the cache was made from ({})", error.what());
          e.info = nullptr;
        }
      }
    } else {
      continue;  // not a cache's folder: left alone
    }
    e.bytes = folder_bytes(it->path());
    const auto written = fs::last_write_time(it->path(), entry_ec);
    e.idle_seconds = entry_ec ? 0 : std::chrono::duration<double>(now - written).count();
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const TokenCacheEntry& a, const TokenCacheEntry& b) { return a.path < b.path; });
  return entries;
}

bool token_cache_prunable(const TokenCacheEntry& e, const TokenCachePrune& prune) {
  using S = TokenCacheEntry::State;
  switch (e.state) {
    case S::kStale:
    case S::kDamaged:
    case S::kAbandoned: return true;
    case S::kBuilding: return false;
    case S::kCurrent:
    case S::kElsewhere: return prune.all || (prune.unused_days >= 0 && e.idle_seconds >= prune.unused_days * 86400);
  }
  return false;
}

TokenCacheStats build_token_cache(const std::string& folder, const DocumentSource& documents,
                                  const Tokenizer& tokenizer, bool progress) {
  const auto start = std::chrono::steady_clock::now();
  DocumentReader reader(documents.source, documents.format, documents.field);
  TokenCacheStats stats;
  stats.built = build_cache_folder(folder, document_cache_key(documents), tokenizer, [&](const std::string& tmp) {
    const int32_t bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
    TokenFileWriter train((fs::path(tmp) / "train.tok").string(), tokenizer.vocab_size(), eos, bos);
    TokenFileWriter val((fs::path(tmp) / "val.tok").string(), tokenizer.vocab_size(), eos, bos);
    const size_t head = bos >= 0 ? 1 : 0, tail = eos >= 0 ? 1 : 0;  // the writers add BOS and EOS themselves
    encode_and_split(reader, tokenizer, documents.val_fraction, documents.seed, progress,
                     [&](bool held_out, std::span<const int32_t> ids) {
                       (held_out ? val : train).append_document(ids.subspan(head, ids.size() - head - tail));
                     });
    train.finish();
    val.finish();
    stats.documents = reader.documents();
    stats.text_bytes = reader.text_bytes();
    stats.train_tokens = train.header().token_count;
    stats.val_tokens = val.header().token_count;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return nlohmann::ordered_json{{"documents", stats.documents},     {"text_bytes", stats.text_bytes},
                                  {"train_tokens", stats.train_tokens}, {"val_tokens", stats.val_tokens},
                                  {"seconds", stats.seconds}};
  });
  return stats;
}

}  // namespace shardtrain::data
