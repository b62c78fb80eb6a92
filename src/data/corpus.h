// Reading documents: the built-in corpus (Debian's `fortunes` package, plain English text
// installed by scripts/setup.sh) and user text / JSONL / Parquet files.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::data {

// Where Debian installs the fortune files.
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Every fortune (the text between lines holding only "%") of every plain fortune file in
// `dir` (files without the .dat / .u8 suffixes), in file-name order. Throws, naming the
// folder and how to install it, when it is missing or empty.
std::vector<std::string> load_fortunes(const std::string& dir = kFortunesDir);

// A plain text file: documents separated by one or more blank lines.
std::vector<std::string> load_text_documents(const std::string& path);

// A JSONL file: one JSON object per line, the document in string field `field`.
// Errors name the file, the line number and the field.
std::vector<std::string> load_jsonl_documents(const std::string& path, const std::string& field);

// The files `source` names, in name order: the file itself, the files of a folder, or the
// files matching a pattern in its last component (`*`, `?`, `[...]`, as a shell matches them:
// "data/train-*.parquet"). A pattern that matches nothing is an error naming it.
std::vector<std::string> source_files(const std::string& source);
bool is_source_pattern(const std::string& source);  // wildcards in the last component

// The Parquet files among source_files(source); an error naming `source` when there are none.
std::vector<std::string> parquet_files(const std::string& source);

// Parquet files (a file, a folder or a pattern: parquet_files): the document in string column
// `field` of each row, files in name order and row groups in order; rows where it is null or
// empty are skipped. Errors name the file, row group and column, and list the file's fields
// when `field` is not one of them.
std::vector<std::string> load_parquet_documents(const std::string& source, const std::string& field);

}  // namespace shardtrain::data
