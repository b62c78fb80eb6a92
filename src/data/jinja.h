// A Jinja2 interpreter for the subset chat templates are written in. transformers renders a
// tokenizer_config.json's chat_template with jinja2's ImmutableSandboxedEnvironment, trim_blocks
// and lstrip_blocks on and the loop controls; this renders the same text for the same inputs.
// Statements: if/elif/else, for (tuple targets, `if` filters, else, loop.*, break, continue),
// set (names, namespace attributes, tuples), macro, and transformers' generation blocks.
// Expressions: Python-like literals, lists, dicts, attribute and item access, slices, calls,
// filters, tests, arithmetic, comparisons, `in`, `and`/`or`/`not`, `~` and conditional
// expressions. Anything else (include, extends, call blocks, unknown filters) is refused
// naming the line. Strings remember where their bytes came from (a tag per run of bytes), so
// a caller can find where an input string's text lies in the output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardtrain::data::jinja {

class Value;
struct Call;  // a call's arguments, for functions given to the context

// A run of a string's bytes [begin, end) that came from an input tagged `tag` (>= 0). A string's
// segments are in order and do not overlap.
struct Segment {
  size_t begin = 0, end = 0;
  int tag = -1;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  using List = std::vector<Value>;
  // Insertion-ordered, as Python's dicts.
  struct Dict {
    std::vector<std::pair<std::string, Value>> entries;
    bool is_namespace = false;  // made by namespace(): `{% set ns.name = ... %}` may change it
    const Value* find(std::string_view key) const;
    void set(const std::string& key, Value value);
  };
  using Function = std::function<Value(Call& call)>;

  Value() = default;  // undefined
  static Value undefined(std::string name = "");
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s, int tag = -1);  // tag >= 0: every byte came from that input
  static Value string(std::string s, std::vector<Segment> segments);
  static Value list();  // empty
  static Value list(List items);
  static Value tuple(List items);  // a list that prints as Python's tuple: (1, 2)
  static Value dict(Dict d);
  static Value function(std::string name, Function fn);
  // JSON as Python's json.loads gives it; strings tagged with `tag` (-1: none).
  static Value from_json(const nlohmann::json& j, int tag = -1);
  // Objects keep the file's key order, as Python's json.loads does (tojson prints them so).
  static Value from_json(const nlohmann::ordered_json& j, int tag = -1);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_tuple() const { return tuple_; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& str() const { return s_; }
  const std::vector<Segment>& segments() const { return segments_; }
  const List& items() const { return *list_; }
  const Dict& entries() const { return *dict_; }
  Dict& mutable_entries() { return *dict_; }
  const Function& fn() const { return *fn_; }
  const std::string& name() const { return name_; }  // an undefined value's or a function's
  // The same list or dict object (not an equal one).
  bool same_object(const Value& other) const;

  bool truthy() const;  // Python's bool(): empty strings, lists, dicts, 0, None, undefined are false
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false, tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_, name_;
  std::vector<Segment> segments_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// A function's arguments: positional, then keyword.
struct Call {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  std::string where;  // "line 3 of `chat_template`", for errors
  // The argument at `index` or named `name`; `fallback` when neither is given.
  Value arg(size_t index, const char* name, Value fallback = Value()) const;
};

// What a render produced besides its text: the tagged runs of the output, each iteration of
// a `for` over a list of dicts (the dict, by its place in the list given, and the output
// range it wrote), and the output ranges of generation blocks.
struct Rendered {
  std::string text;
  std::vector<Segment> segments;
  struct Iteration {
    const Value::Dict* item = nullptr;
    size_t begin = 0, end = 0;
  };
  std::vector<Iteration> iterations;
  std::vector<std::pair<size_t, size_t>> generation;
};

class Template {
 public:
  // Parses `source`; throws naming `name` and the line of the first problem.
  Template(std::string_view source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (a dict of top-level names); throws naming the template and line, or
  // where the output would pass `max_output` bytes. A render is bounded (a template is outside
  // input): also by a million loop iterations, macros 64 deep and a GiB of values built.
  static constexpr size_t kMaxOutput = size_t{16} << 20;
  Rendered render(const Value& context, size_t max_output = kMaxOutput) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The most bytes one string a render makes may hold (a filter's result, `~`, tojson's JSON):
// what its output may hold by default.
inline constexpr size_t kMaxString = Template::kMaxOutput;

// Python's str() of a value (what {{ value }} prints), and json.dumps as transformers' tojson
// filter calls it (ensure_ascii off; `indent` < 0: none). to_json throws "tojson: the JSON
// would pass N bytes" before its text grows beyond `max_bytes` (an indent repeats at every
// level of every item, so a small value can ask for gigabytes).
std::string to_python_string(const Value& v);
std::string to_json(const Value& v, int indent, size_t max_bytes = kMaxString);

}  // namespace shardtrain::data::jinja
