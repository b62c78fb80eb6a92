// `shardtrain cache`: the token caches of a folder, listed and pruned (data/token_cache.h).
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/allocator.h"
#include "core/error.h"
#include "data/token_cache.h"

namespace shardtrain::cli {

namespace {

std::string folders(size_t n) { return fmt::format("{} folder{}", n, n == 1 ? "" : "s"); }

std::string idle_text(double seconds) {
  if (seconds < 120) return "now";
  if (seconds < 7200) return fmt::format("{:.0f} min ago", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.0f} h ago", seconds / 3600);
  return fmt::format("{:.0f} days ago", seconds / 86400);
}

// What a complete cache holds, from its source.json: "big.jsonl (jsonl): 5929 documents,
// 22586989 + 3737257 tokens".
std::string cache_contents(const nlohmann::ordered_json& info) {
  if (info.is_null()) return {};
  std::string s = fmt::format("{} ({})", info.value("source", std::string("?")), info.value("format", std::string("?")));
  if (info.contains("examples")) return s + fmt::format(": {} examples", info["examples"].dump());
  if (info.contains("documents"))
    s += fmt::format(": {} documents, {} training + {} held-out tokens", info["documents"].dump(),
                     info.value("train_tokens", nlohmann::ordered_json()).dump(),
                     info.value("val_tokens", nlohmann::ordered_json()).dump());
  return s;
}

}  // namespace

int run_cache(const std::vector<std::string>& args) {
  std::string action = "list", dir;
  data::TokenCachePrune prune;
  bool dry_run = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      ST_CHECK(i + 1 < args.size(), "cache: ", a, " needs a value");
      return args[++i];
    };
    if (a == "--dir") dir = value();
    else if (a == "--all") prune.all = true;
    else if (a == "--dry-run") dry_run = true;
    else if (a == "--unused-days") {
      prune.unused_days = number_flag(a, value(), "cache");
      ST_CHECK(prune.unused_days >= 0, "cache: --unused-days takes a number of days, 0 or more; found ", prune.unused_days);
    } else if (a.rfind("--", 0) == 0) unknown_option("cache", a);
    else if (i == 0 && (a == "list" || a == "prune")) action = a;
    else ST_THROW("cache: unexpected argument `", a, "` (expected list or prune first, then options)");
  }
  ST_CHECK(action == "prune" || (!prune.all && prune.unused_days < 0 && !dry_run),
           "cache: --all, --unused-days and --dry-run go with `cache prune`");
  if (dir.empty()) dir = data::default_token_cache_dir();
  ST_CHECK(!dir.empty(), "cache: neither XDG_CACHE_HOME nor HOME is set; name the folder with --dir");
  const std::vector<data::TokenCacheEntry> entries = data::scan_token_cache_dir(dir);
  if (entries.empty()) {
    std::printf("no token caches in %s\n", dir.c_str());
    return 0;
  }
  int64_t total = 0;
  for (const data::TokenCacheEntry& e : entries) total += e.bytes;
  if (action == "list") {
    std::printf("token caches in %s: %s, %s\n", dir.c_str(), folders(entries.size()).c_str(),
                format_bytes(total).c_str());
    size_t prunable = 0;
    int64_t prunable_bytes = 0;
    for (const data::TokenCacheEntry& e : entries) {
      const std::string name = std::filesystem::path(e.path).filename().string();
      const bool complete = !e.info.is_null();
      const std::string when = fmt::format("{} {}", complete ? "used" : "written", idle_text(e.idle_seconds));
      std::printf("  %-9s %10s  %-19s %s\n", data::token_cache_state_name(e.state), format_bytes(e.bytes).c_str(),
                  when.c_str(), name.c_str());
      const std::string contents = cache_contents(e.info);
      if (!contents.empty()) std::printf("%46s%s\n", "", contents.c_str());
      if (!e.detail.empty()) std::printf("%46s%s\n", "", e.detail.c_str());
      if (data::token_cache_prunable(e, {})) {
        ++prunable;
        prunable_bytes += e.bytes;
      }
    }
    if (prunable > 0)
      std::printf("`shardtrain cache prune` removes the %s stale, damaged or abandoned: %s\n",
                  folders(prunable).c_str(), format_bytes(prunable_bytes).c_str());
    return 0;
  }
  size_t removed = 0, failed = 0;
  int64_t freed = 0;
  for (const data::TokenCacheEntry& e : entries) {
    if (!data::token_cache_prunable(e, prune)) continue;
    std::error_code ec;
    if (!dry_run) std::filesystem::remove_all(e.path, ec);
    if (ec) {
      std::fprintf(stderr, "cache: could not remove `%s`: %s\n", e.path.c_str(), ec.message().c_str());
      ++failed;
      continue;
    }
    std::printf("%s %s (%s, %s)\n", dry_run ? "would remove" : "removed", e.path.c_str(),
                data::token_cache_state_name(e.state), format_bytes(e.bytes).c_str());
    ++removed;
    freed += e.bytes;
  }
  std::printf("%s %zu of %s, %s, in %s\n", dry_run ? "would remove" : "removed", removed,
              folders(entries.size()).c_str(), format_bytes(freed).c_str(), dir.c_str());
  ST_CHECK(failed == 0, "cache: ", failed, " folder(s) could not be removed (see above)");
  return 0;
}

}  // namespace shardtrain::cli
