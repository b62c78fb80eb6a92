// The Jinja interpreter's syntax tree, shared by its parser (jinja_parse.cpp) and renderer
// (jinja_render.cpp). Internal to data/.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja.h"

namespace shardtrain::data::jinja {

enum class ExprKind {
  kLiteral,  // literal
  kName,     // name
  kAttr,     // args[0].name
  kItem,     // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts absent)
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs)
  kTest,     // args[0] is [not] name(args[1..])
  kUnary,    // name args[0]: "-", "+"
  kBinary,   // args[0] name args[1]: + - * / // % ** ~
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in "not in"
  kAnd,
  kOr,
  kNot,
  kCond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
  kList,     // [args...]
  kTuple,    // (args...)
  kDict,     // {args[0]: args[1], args[2]: args[3], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

enum class StmtKind { kText, kOutput, kIf, kFor, kSet, kMacro, kGeneration, kBreak, kContinue };

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;                                 // kText
  ExprPtr expr;                                     // kOutput, kSet's value, kFor's iterable
  std::vector<std::pair<ExprPtr, Body>> branches;   // kIf: (condition, body) for if and each elif
  Body body;                                        // kFor, kMacro, kGeneration
  Body else_body;                                   // kIf, kFor
  std::vector<std::string> targets;                 // kFor, kSet: names (one, or a tuple's)
  std::string attribute;                            // kSet of `name.attribute` (targets[0] the name)
  ExprPtr filter;                                   // kFor's `if` condition
  std::string name;                                 // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: names and defaults (null: none)
};

// Parses a template (trim_blocks and lstrip_blocks on, as transformers renders chat templates).
Body parse_template(std::string_view source, const std::string& name);

// String helpers that keep provenance (jinja_builtins.cpp).
std::vector<size_t> code_points(const std::string& s);  // each code point's byte offset, then the size
Value substring(const Value& v, size_t begin, size_t end);  // bytes [begin, end)
Value concat(const Value& a, const Value& b);
// kMaxString (jinja.h) bounds every string an expression makes: a filter that multiplies its
// input (indent's pad on every line, join's separator between every item, replace's new text
// at every match) could otherwise ask for terabytes at once. check_string throws StringLimit
// where a string of `now` bytes growing by `more` would pass it; the renderer reports it at
// the expression's line.
struct StringLimit : Error {
  using Error::Error;
};
void check_string(size_t now, size_t more);
// Builds a string value from string pieces in time linear in its size (a loop of concat()
// would copy the growing prefix every time); each piece's segments shift along. At most
// kMaxString bytes.
class StringBuilder {
 public:
  void append(const Value& piece);
  Value take() { return Value::string(std::move(text_), std::move(segments_)); }

 private:
  std::string text_;
  std::vector<Segment> segments_;
};
// str.strip / lstrip / rstrip: Python's whitespace, or the characters of `chars` when a string
Value strip(const Value& v, bool left, bool right, const Value& chars);
bool equal(const Value& a, const Value& b);  // Python's ==
bool is_python_space(unsigned char c);
std::string html_escape(const std::string& s);

// What expressions do to values, with errors naming the template and line
// (jinja_builtins.cpp); the renderer (jinja_render.cpp) is one.
class Operations {
 public:
  explicit Operations(const std::string& name) : name_(name) {}

 protected:
  [[noreturn]] void fail(int line, const std::string& message) const;
  std::string where(int line) const;
  // The values a for loop visits: a list's items, a dict's keys, a string's characters.
  std::vector<Value> iterate(const Value& v, int line);
  // `self.name` where it is a string's or dict's method (a function bound to self), else undefined.
  Value method(const Value& self, const std::string& name);
  Value string_method(const Value& s, const std::string& name, Call& c);
  // jinja2's getattr (attribute, then item) and getitem (item, then attribute); `what` names
  // the object in messages.
  Value attribute(const Value& obj, const std::string& name, int line, const std::string& what);
  Value item(const Value& obj, const Value& key, int line, const std::string& what);
  Value attribute_path(const Value& x, const Value& path, int line);  // "a.b" or an index
  Value binary(const std::string& op, const Value& a, const Value& b, int line);  // + - * / // % ** ~
  bool contains(const Value& container, const Value& v, int line);
  bool compare(const std::string& op, const Value& a, const Value& b, int line);
  bool test(const std::string& name, const Value& v, const Call& c, int line);
  Value filter(const std::string& name, const Value& v, Call& c, int line);

  const std::string& name_;
};

}  // namespace shardtrain::data::jinja
