// Every relative link in README.md, BENCHMARKS.md and docs/**/*.md points to a file of the
// repository, and every #anchor into a Markdown file to one of its headings, so the docs
// cannot rot silently when a page or a heading moves.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

#include "testing/shared_data.h"

namespace fs = std::filesystem;

namespace shardtrain::testing {
namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// GitHub's anchor for a heading: lower case, the inline code marks and punctuation dropped,
// each space a hyphen. Characters outside ASCII are dropped too (our headings use none).
std::string slug(const std::string& heading) {
  std::string out;
  for (const char c : heading) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '_' || c == '-') out += static_cast<char>(std::tolower(u));
    else if (c == ' ') out += '-';
  }
  return out;
}

// The lines outside fenced code blocks, with their numbers.
std::vector<std::pair<int, std::string>> prose_lines(const std::string& text) {
  std::vector<std::pair<int, std::string>> lines;
  std::istringstream in(text);
  std::string fence;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const size_t indent = line.find_first_not_of(' ');
    const std::string body = indent == std::string::npos ? "" : line.substr(indent);
    if (fence.empty() && (body.rfind("```", 0) == 0 || body.rfind("~~~", 0) == 0)) {
      fence = body.substr(0, 3);
      continue;
    }
    if (!fence.empty()) {
      if (body.rfind(fence, 0) == 0) fence.clear();
      continue;
    }
    lines.emplace_back(number, line);
  }
  return lines;
}

// The anchors a Markdown file defines: its headings' slugs (a repeated one gets -1, -2, ...)
// and the ids of <a id="..."> / <a name="..."> tags.
std::set<std::string> anchors_of(const std::string& text) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  for (const auto& [number, line] : prose_lines(text)) {
    size_t hashes = 0;
    while (hashes < line.size() && line[hashes] == '#') ++hashes;
    if (hashes >= 1 && hashes <= 6 && hashes < line.size() && line[hashes] == ' ') {
      const std::string base = slug(line.substr(hashes + 1));
      const int n = seen[base]++;
      anchors.insert(n == 0 ? base : base + "-" + std::to_string(n));
    }
    for (const std::string attr : {"id=\"", "name=\""}) {
      for (size_t at = line.find("<a " + attr); at != std::string::npos; at = line.find("<a " + attr, at + 1)) {
        const size_t start = at + 3 + attr.size(), end = line.find('"', start);
        if (end != std::string::npos) anchors.insert(line.substr(start, end - start));
      }
    }
  }
  return anchors;
}

struct Link {
  int line;
  std::string target;
};

// Inline links and images, `[text](target)` and `![alt](target "title")`, outside code.
std::vector<Link> links_of(const std::string& text) {
  std::vector<Link> links;
  for (auto [number, line] : prose_lines(text)) {
    // inline code spans hold commands and examples, not links
    for (size_t open = line.find('`'); open != std::string::npos; open = line.find('`', open)) {
      size_t ticks = 1;
      while (open + ticks < line.size() && line[open + ticks] == '`') ++ticks;
      const size_t close = line.find(std::string(ticks, '`'), open + ticks);
      if (close == std::string::npos) break;
      line.erase(open, close + ticks - open);
    }
    for (size_t at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2)) {
      const size_t end = line.find(')', at + 2);
      if (end == std::string::npos) break;
      std::string target = line.substr(at + 2, end - at - 2);
      if (const size_t space = target.find(' '); space != std::string::npos) target.resize(space);  // a title
      if (target.size() >= 2 && target.front() == '<' && target.back() == '>') target = target.substr(1, target.size() - 2);
      links.push_back({number, target});
    }
  }
  return links;
}

// "file:line: what is wrong" for each broken relative link of `file` (inside `root`).
std::vector<std::string> broken_links(const fs::path& root, const fs::path& file) {
  std::vector<std::string> problems;
  const std::string where = fs::relative(file, root).string() + ":";
  for (const Link& link : links_of(read_file(file))) {
    const std::string& t = link.target;
    if (t.empty()) {
      problems.push_back(where + std::to_string(link.line) + ": an empty link target");
      continue;
    }
    if (t.find("://") != std::string::npos || t.rfind("mailto:", 0) == 0) continue;  // not ours to check
    const size_t hash = t.find('#');
    const std::string path_part = t.substr(0, hash), anchor = hash == std::string::npos ? "" : t.substr(hash + 1);
    const fs::path target = path_part.empty() ? file : (path_part.front() == '/' ? root / path_part.substr(1)
                                                                                 : file.parent_path() / path_part);
    const fs::path resolved = fs::weakly_canonical(target);
    const std::string rel = fs::relative(resolved, fs::canonical(root)).string();
    if (rel.empty() || rel.rfind("..", 0) == 0) {
      problems.push_back(where + std::to_string(link.line) + ": `" + t + "` points outside the repository");
      continue;
    }
    if (!fs::exists(resolved)) {
      problems.push_back(where + std::to_string(link.line) + ": `" + t + "`: no file " + rel);
      continue;
    }
    if (!anchor.empty() && resolved.extension() == ".md" && fs::is_regular_file(resolved) &&
        !anchors_of(read_file(resolved)).count(anchor))
      problems.push_back(where + std::to_string(link.line) + ": `" + t + "`: " + rel + " has no heading with the anchor #" +
                         anchor);
  }
  return problems;
}

std::vector<fs::path> doc_files(const fs::path& root) {
  std::vector<fs::path> files;
  for (const char* top : {"README.md", "BENCHMARKS.md"})
    if (fs::exists(root / top)) files.push_back(root / top);
  if (fs::is_directory(root / "docs"))
    for (const auto& entry : fs::recursive_directory_iterator(root / "docs"))
      if (entry.is_regular_file() && entry.path().extension() == ".md") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(DocLinks, SlugsAreGitHubs) {
  EXPECT_EQ(slug("Two commands (fresh Debian 12)"), "two-commands-fresh-debian-12");
  EXPECT_EQ(slug("`[training]`"), "training");
  EXPECT_EQ(slug("FP8 on Hopper (`training.fp8`)"), "fp8-on-hopper-trainingfp8");
  EXPECT_EQ(slug("One H100: a + b (2026-11-27, commit 5e31871)"), "one-h100-a--b-2026-11-27-commit-5e31871");
  EXPECT_EQ(anchors_of("# A\n## A\n```\n# A\n```\n### A\n"), (std::set<std::string>{"a", "a-1", "a-2"}));
}

TEST(DocLinks, TheCheckerFindsABrokenFileAnAnchorAndALinkOutside) {
  const fs::path root = fs::temp_directory_path() / ("shardtrain_doc_links_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "docs");
  std::ofstream(root / "README.md") << "# Top\n\n[ok](docs/a.md#second-part) [gone](docs/b.md) [bad](docs/a.md#third)\n"
                                       "`[code](docs/nothing.md)` [out](../elsewhere/x.md) [self](#top)\n"
                                       "```\n[fenced](docs/nothing.md)\n```\n![img](docs/pic.png)\n";
  std::ofstream(root / "docs/a.md") << "# First\n\n## Second part\n";
  const std::vector<std::string> problems = broken_links(root, root / "README.md");
  fs::remove_all(root);
  ASSERT_EQ(problems.size(), 4u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("README.md:3: `docs/b.md`: no file docs/b.md"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("has no heading with the anchor #third"), std::string::npos) << problems[1];
  EXPECT_NE(problems[2].find("`../elsewhere/x.md` points outside the repository"), std::string::npos) << problems[2];
  EXPECT_NE(problems[3].find("README.md:8: `docs/pic.png`: no file"), std::string::npos) << problems[3];
}

TEST(DocLinks, EveryRelativeLinkOfTheDocsResolves) {
  const fs::path root = fs::canonical(source_dir());
  const std::vector<fs::path> files = doc_files(root);
  ASSERT_FALSE(files.empty()) << "no README.md or docs/*.md under " << root;
  std::vector<std::string> problems;
  size_t links = 0;
  for (const fs::path& file : files) {
    links += links_of(read_file(file)).size();
    for (const std::string& p : broken_links(root, file)) problems.push_back(p);
  }
  EXPECT_GT(links, 0u);
  std::string all;
  for (const std::string& p : problems) all += "\n  " + p;
  EXPECT_TRUE(problems.empty()) << problems.size() << " broken links (fix the link, or the heading it names):" << all;
}

}  // namespace
}  // namespace shardtrain::testing
