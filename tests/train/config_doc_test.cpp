// docs/configuration.md is generated from the config key table; this fails when the two differ.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/shared_data.h"
#include "train/config.h"

namespace shardtrain::train {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(ConfigDoc, DocsConfigurationIsTheGeneratedPage) {
  const std::string path = testing::source_dir() + "/docs/configuration.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::ostringstream page;
  page << in.rdbuf();
  const std::string expected = reference_markdown();
  if (page.str() == expected) return;
  const std::vector<std::string> have = lines_of(page.str()), want = lines_of(expected);
  size_t line = 0;
  while (line < have.size() && line < want.size() && have[line] == want[line]) ++line;
  ADD_FAILURE() << path << " is not the page the config key table (src/train/config.cpp) makes: line " << line + 1
                << " is\n  " << (line < have.size() ? have[line] : "(the end of the file)") << "\nwhere the table gives\n  "
                << (line < want.size() ? want[line] : "(the end of the page)")
                << "\nRegenerate it with `./build/shardtrain help config --markdown > docs/configuration.md`.";
}

TEST(ConfigDoc, EveryKeyOfTheTerminalTableIsOnThePageUnderItsSection) {
  const std::vector<std::string> page = lines_of(reference_markdown());
  std::string section;
  size_t rows = 0;
  for (const std::string& line : page) {
    if (line.rfind("## `[", 0) == 0) section = line.substr(5, line.find(']') - 5);
    if (line.rfind("| `", 0) != 0) continue;
    ++rows;
    EXPECT_EQ(line.rfind("| `" + section + ".", 0), 0u) << "a row outside its section `" << section << "`: " << line;
  }
  size_t table_rows = 0;
  for (const std::string& line : lines_of(reference_table())) table_rows += line.rfind("| `", 0) == 0;
  EXPECT_EQ(rows, table_rows);
  EXPECT_GT(rows, 50u);
}

TEST(ConfigDoc, AnAsteriskOutsideCodeIsEscaped) {
  // "config.json, *.safetensors" and "the model.* keys" would otherwise italicise what lies between
  const std::string page = reference_markdown();
  EXPECT_NE(page.find("\\*.safetensors"), std::string::npos);
  for (const std::string& line : lines_of(page)) {
    bool code = false;
    for (size_t i = 0; i < line.size(); ++i) {
      code ^= line[i] == '`';
      if (line[i] == '*' && !code) {
        EXPECT_TRUE(i > 0 && line[i - 1] == '\\') << line;
      }
    }
  }
}

TEST(ConfigDoc, APipeInsideACellIsEscaped) {
  // an unescaped '|' in a key's text would split its row into extra cells
  for (const std::string& line : lines_of(reference_markdown())) {
    if (line.rfind("| `", 0) != 0) continue;
    size_t cells = 0;
    for (size_t i = 0; i < line.size(); ++i) cells += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    EXPECT_EQ(cells, 5u) << line;
  }
}

}  // namespace
}  // namespace shardtrain::train
