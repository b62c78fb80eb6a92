// The Jinja parser: the template split into text and tags (with trim_blocks, lstrip_blocks
// and the `-` / `+` whitespace controls applied), then each tag's expression parsed with
// jinja2's precedence (conditional, or, and, not, comparisons, + -, ~, * / // %, **, unary,
// postfix, filters and tests).
#include <cctype>
#include <set>

#include "core/error.h"
#include "data/jinja_internal.h"
#include "data/utf8.h"

namespace shardtrain::data::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

struct Chunk {
  enum class Type { kText, kVar, kBlock } type;
  std::string content;
  int line;
};

int count_lines(std::string_view s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to; ++i) n += s[i] == '\n';
  return n;
}

// The end of a tag opened at `from` (the offset of its closing delimiter `close`), skipping
// quoted strings and brackets inside it (`{{ {'a': {}} }}` ends at the last `}}`), as
// jinja2's lexer balances them; npos when it never closes.
size_t find_tag_end(std::string_view src, size_t from, std::string_view close, bool expression) {
  int depth = 0;
  for (size_t i = from; i + 1 < src.size(); ++i) {
    const char c = src[i];
    if (expression && (c == '\'' || c == '"')) {
      for (++i; i < src.size() && src[i] != c; ++i)
        if (src[i] == '\\') ++i;
      continue;
    }
    if (depth == 0 && src.compare(i, close.size(), close) == 0) return i;
    if (!expression) continue;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  return std::string_view::npos;
}

std::vector<Chunk> scan(std::string_view src, const std::string& name) {
  std::vector<Chunk> chunks;
  size_t pos = 0;
  int line = 1;
  while (pos <= src.size()) {
    size_t open = std::string_view::npos;
    for (const char* delim : {"{{", "{%", "{#"}) open = std::min(open, src.find(delim, pos));
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (open == std::string_view::npos) {
      if (!text.empty()) chunks.push_back({Chunk::Type::kText, text, line});
      break;
    }
    const char kind = src[open + 1];  // '{' variable, '%' block, '#' comment
    const bool block_like = kind == '%' || kind == '#';
    const char modifier = open + 2 < src.size() ? src[open + 2] : '\0';
    if (modifier == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (block_like && modifier != '+') {
      // lstrip_blocks: a tag alone at the start of a line takes the line's indentation with it
      size_t i = open;
      while (i > pos && (src[i - 1] == ' ' || src[i - 1] == '\t')) --i;
      if (i == 0 || src[i - 1] == '\n') text.resize(text.size() - (open - i));
    }
    if (!text.empty()) chunks.push_back({Chunk::Type::kText, text, line});
    line += count_lines(src, pos, open);
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t inner_begin = open + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
    const size_t end = find_tag_end(src, inner_begin, close, kind != '#');
    ST_CHECK(end != std::string_view::npos, "`", name, "` line ", line, ": a tag opened with `", src.substr(open, 2),
             "` is never closed with `", close, "`");
    size_t inner_end = end;
    const bool strip_after = inner_end > inner_begin && src[inner_end - 1] == '-';
    const bool keep_newline = inner_end > inner_begin && src[inner_end - 1] == '+';
    if (strip_after || keep_newline) --inner_end;
    if (kind != '#') {
      chunks.push_back({kind == '{' ? Chunk::Type::kVar : Chunk::Type::kBlock,
                        std::string(src.substr(inner_begin, inner_end - inner_begin)), line});
    }
    line += count_lines(src, open, end + 2);
    pos = end + 2;
    if (strip_after) {
      while (pos < src.size() && is_space(src[pos])) line += src[pos++] == '\n';
    } else if (block_like && !keep_newline) {  // trim_blocks: the newline after a block tag
      if (src.compare(pos, 2, "\r\n") == 0) {
        pos += 2;
        ++line;
      } else if (pos < src.size() && src[pos] == '\n') {
        ++pos;
        ++line;
      }
    }
  }
  return chunks;
}

struct Token {
  enum class Type { kName, kInt, kFloat, kString, kOp, kEnd } type;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> tokenize(const std::string& s, const std::string& where) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Type::kName, s.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        for (++j; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])); ++j) {
        }
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          for (j = k; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])); ++j) {
          }
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') digits += s[k];
      Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, digits};
      if (is_float) {
        t.f = std::strtod(digits.c_str(), nullptr);  // out of range: inf, as Python's float()
      } else {
        try {
          t.i = std::stoll(digits);
        } catch (const std::exception&) {
          ST_THROW(where, ": integer literal ", digits, " out of range");
        }
      }
      out.push_back(t);
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          value += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case '0': value += '\0'; break;
          case '\\': value += '\\'; break;
          case '\'': value += '\''; break;
          case '"': value += '"'; break;
          case '\n': break;  // a line continuation
          case 'x':
          case 'u':
          case 'U': {
            const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            ST_CHECK(j + digits < s.size(), where, ": truncated \\", e, " escape in a string literal");
            uint32_t cp = 0;
            for (size_t k = j + 1; k <= j + digits; ++k) {
              const char d = s[k];
              const int h = d >= '0' && d <= '9' ? d - '0'
                            : d >= 'a' && d <= 'f' ? d - 'a' + 10
                            : d >= 'A' && d <= 'F' ? d - 'A' + 10
                                                   : -1;
              ST_CHECK(h >= 0, where, ": \\", e, " escape with a non-hexadecimal digit `", std::string(1, s[k]), "`");
              cp = cp * 16 + static_cast<uint32_t>(h);
            }
            ST_CHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), where, ": \\", e, " escape of U+",
                     std::to_string(cp), " is no Unicode scalar value");
            append_utf8(value, static_cast<char32_t>(cp));
            j += digits;
            break;
          }
          default:  // Python keeps unknown escapes as written
            value += '\\';
            value += e;
        }
      }
      ST_CHECK(j < s.size(), where, ": a string literal is never closed");
      out.push_back({Token::Type::kString, value});
      i = j + 1;
      continue;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                       "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (s.compare(i, n, op) == 0) {
        out.push_back({Token::Type::kOp, op});
        i += n;
        matched = true;
        break;
      }
    }
    ST_CHECK(matched, where, ": unexpected character `", std::string(1, c), "`");
  }
  out.push_back({Token::Type::kEnd, ""});
  return out;
}

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// Names that end an expression rather than start one.
bool is_keyword(const std::string& s) {
  static const std::set<std::string> k = {"and", "or", "not", "in", "is", "if", "else", "for", "recursive"};
  return k.count(s) > 0;
}

class ExprParser {
 public:
  ExprParser(const std::string& source, int line, std::string where)
      : toks_(tokenize(source, where)), line_(line), where_(std::move(where)) {}

  const Token& peek(size_t ahead = 0) const { return toks_[std::min(i_ + ahead, toks_.size() - 1)]; }
  bool at_end() const { return peek().type == Token::Type::kEnd; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::kName && peek(ahead).text == name;
  }
  Token next() { return toks_[std::min(i_++, toks_.size() - 1)]; }
  void expect_op(const char* op) {
    ST_CHECK(is_op(op), where_, ": expected `", op, "`, found ", describe(peek()));
    ++i_;
  }
  std::string expect_name() {
    ST_CHECK(peek().type == Token::Type::kName, where_, ": expected a name, found ", describe(peek()));
    return next().text;
  }
  void expect_end() { ST_CHECK(at_end(), where_, ": unexpected ", describe(peek()), " after the expression"); }
  static std::string describe(const Token& t) {
    return t.type == Token::Type::kEnd ? std::string("the end of the tag") : "`" + t.text + "`";
  }
  const std::string& where() const { return where_; }

  ExprPtr expression(bool with_condition = true) {
    ExprPtr e = or_expr();
    if (with_condition && is_name("if")) {
      ++i_;
      auto c = make(ExprKind::kCond, line_);
      ExprPtr test = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++i_;
        otherwise = expression();
      }
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(otherwise));
      return c;
    }
    return e;
  }

  // An expression, or several separated by commas as a tuple (`for` targets' iterables, `set`).
  ExprPtr tuple(bool with_condition = true) {
    ExprPtr first = expression(with_condition);
    if (!is_op(",")) return first;
    auto t = make(ExprKind::kTuple, line_);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (at_end() || is_op(")") || is_name("if")) break;
      t->args.push_back(expression(with_condition));
    }
    return t;
  }

  // `a or b or ...` / `a and b and ...`, left to right.
  ExprPtr logical(ExprPtr (ExprParser::*operand)(), const char* keyword, ExprKind kind) {
    ExprPtr e = (this->*operand)();
    while (is_name(keyword)) {
      ++i_;
      auto o = make(kind, line_);
      o->args.push_back(std::move(e));
      o->args.push_back((this->*operand)());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr or_expr() { return logical(&ExprParser::and_expr, "or", ExprKind::kOr); }
  ExprPtr and_expr() { return logical(&ExprParser::not_expr, "and", ExprKind::kAnd); }

  ExprPtr not_expr() {
    if (is_name("not")) {
      ++i_;
      auto n = make(ExprKind::kNot, line_);
      n->args.push_back(not_expr());
      return n;
    }
    return compare();
  }

  ExprPtr compare() {
    ExprPtr first = math1();
    auto c = make(ExprKind::kCompare, line_);
    c->args.push_back(std::move(first));
    for (;;) {
      std::string op;
      if (peek().type == Token::Type::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      c->ops.push_back(op);
      c->args.push_back(math1());
    }
    if (c->ops.empty()) return std::move(c->args[0]);
    return c;
  }

  ExprPtr binary_left(ExprPtr (ExprParser::*operand)(), std::initializer_list<const char*> ops) {
    ExprPtr e = (this->*operand)();
    for (;;) {
      const char* found = nullptr;
      for (const char* op : ops)
        if (is_op(op)) found = op;
      if (found == nullptr) return e;
      ++i_;
      auto b = make(ExprKind::kBinary, line_);
      b->name = found;
      b->args.push_back(std::move(e));
      b->args.push_back((this->*operand)());
      e = std::move(b);
    }
  }
  ExprPtr math1() { return binary_left(&ExprParser::concat, {"+", "-"}); }
  ExprPtr concat() { return binary_left(&ExprParser::math2, {"~"}); }
  ExprPtr math2() { return binary_left(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprPtr power() { return binary_left(&ExprParser::unary_filtered, {"**"}); }
  ExprPtr unary_filtered() { return unary(true); }

  ExprPtr unary(bool with_filter) {
    // a template is outside input: bound the recursion its nesting drives
    ST_CHECK(++depth_ <= kMaxDepth, where_, ": expressions nested deeper than ", kMaxDepth);
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = make(ExprKind::kUnary, line_);
      u->name = next().text;
      u->args.push_back(unary(false));
      e = std::move(u);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters_and_tests(std::move(e));
    return e;
  }

  ExprPtr primary() {
    const Token t = next();
    switch (t.type) {
      case Token::Type::kInt: return literal(Value::integer(t.i));
      case Token::Type::kFloat: return literal(Value::number(t.f));
      case Token::Type::kString: {
        std::string s = t.text;
        while (peek().type == Token::Type::kString) s += next().text;  // adjacent literals join
        return literal(Value::string(s));
      }
      case Token::Type::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        ST_CHECK(!is_keyword(t.text), where_, ": unexpected `", t.text, "`");
        auto n = make(ExprKind::kName, line_);
        n->name = t.text;
        return n;
      }
      case Token::Type::kOp:
        if (t.text == "(") {
          if (is_op(")")) {
            ++i_;
            return make(ExprKind::kTuple, line_);
          }
          ExprPtr inner = tuple();
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          auto l = make(ExprKind::kList, line_);
          while (!is_op("]")) {
            l->args.push_back(expression());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("]");
          return l;
        }
        if (t.text == "{") {
          auto d = make(ExprKind::kDict, line_);
          while (!is_op("}")) {
            d->args.push_back(expression());
            expect_op(":");
            d->args.push_back(expression());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("}");
          return d;
        }
        break;
      case Token::Type::kEnd: break;
    }
    ST_THROW(where_, ": expected a value, found ", describe(t));
  }

  ExprPtr literal(Value v) {
    auto e = make(ExprKind::kLiteral, line_);
    e->literal = std::move(v);
    return e;
  }

  void call_arguments(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      ST_CHECK(!is_op("*") && !is_op("**"), where_, ": *args and **kwargs in calls are not supported");
      if (peek().type == Token::Type::kName && is_op("=", 1)) {
        std::string key = next().text;
        ++i_;
        call.kwargs.emplace_back(std::move(key), expression());
      } else {
        ST_CHECK(call.kwargs.empty(), where_, ": a positional argument after a keyword argument");
        call.args.push_back(expression());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++i_;
        auto a = make(ExprKind::kAttr, line_);
        const Token t = next();
        ST_CHECK(t.type == Token::Type::kName || t.type == Token::Type::kInt, where_,
                 ": expected an attribute name after `.`, found ", describe(t));
        a->name = t.text;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++i_;
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        auto c = make(ExprKind::kCall, line_);
        c->args.push_back(std::move(e));
        call_arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr target) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    for (;;) {
      if (is_op(":")) {
        ++i_;
        slice = true;
        ST_CHECK(++part < 3, where_, ": a slice has at most three parts");
        continue;
      }
      if (is_op("]")) break;
      parts[part] = expression();
      if (!is_op(":")) break;
    }
    expect_op("]");
    if (!slice) {
      auto it = make(ExprKind::kItem, line_);
      it->args.push_back(std::move(target));
      ST_CHECK(parts[0] != nullptr, where_, ": empty subscript");
      it->args.push_back(std::move(parts[0]));
      return it;
    }
    auto s = make(ExprKind::kSlice, line_);
    s->args.push_back(std::move(target));
    for (ExprPtr& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  ExprPtr filters_and_tests(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        auto f = make(ExprKind::kFilter, line_);
        f->name = expect_name();
        while (is_op(".")) {  // dotted filter names
          ++i_;
          f->name += "." + expect_name();
        }
        f->args.push_back(std::move(e));
        if (is_op("(")) call_arguments(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        auto t = make(ExprKind::kTest, line_);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          call_arguments(*t);
        } else if (peek().type == Token::Type::kString || peek().type == Token::Type::kInt ||
                   peek().type == Token::Type::kFloat ||
                   (peek().type == Token::Type::kName && !is_keyword(peek().text))) {
          t->args.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas false`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = make(ExprKind::kCall, line_);
        c->args.push_back(std::move(e));
        call_arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

 private:
  static constexpr int kMaxDepth = 200;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int line_;
  int depth_ = 0;
  std::string where_;
};

class StmtParser {
 public:
  StmtParser(std::vector<Chunk> chunks, std::string name) : chunks_(std::move(chunks)), name_(std::move(name)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  std::string where(int line) const { return "`" + name_ + "` line " + std::to_string(line); }

  // The first name of block chunk `c`.
  static std::string keyword(const Chunk& c) {
    size_t i = 0;
    while (i < c.content.size() && is_space(c.content[i])) ++i;
    size_t j = i;
    while (j < c.content.size() && (std::isalnum(static_cast<unsigned char>(c.content[j])) || c.content[j] == '_')) ++j;
    return c.content.substr(i, j - i);
  }

  // Statements until a block tag named in `ends` (returned in `end`, its chunk consumed); an
  // empty `ends` reads to the template's end.
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (pos_ < chunks_.size()) {
      const Chunk& c = chunks_[pos_];
      if (c.type == Chunk::Type::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = c.line;
        s->text = c.content;
        body.push_back(std::move(s));
        ++pos_;
        continue;
      }
      if (c.type == Chunk::Type::kVar) {
        ExprParser p(c.content, c.line, where(c.line));
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = c.line;
        s->expr = p.expression();
        p.expect_end();
        body.push_back(std::move(s));
        ++pos_;
        continue;
      }
      const std::string k = keyword(c);
      if (ends.count(k) > 0) {
        end = k;
        return body;
      }
      body.push_back(statement(c, k));
    }
    ST_CHECK(ends.empty(), where(chunks_.empty() ? 1 : chunks_.back().line),
             ": the template ends inside a block; expected `{% ", *ends.rbegin(), " %}`");
    return body;
  }

  std::unique_ptr<Stmt> statement(const Chunk& c, const std::string& k) {
    const std::string at = where(c.line);
    ST_CHECK(++depth_ <= kMaxDepth, at, ": blocks nested deeper than ", kMaxDepth);
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    ExprParser p(c.content, c.line, at);
    p.expect_name();  // the keyword
    auto s = std::make_unique<Stmt>();
    s->line = c.line;
    ++pos_;
    std::string end;
    if (k == "if") {
      s->kind = StmtKind::kIf;
      ExprPtr cond = p.expression();
      p.expect_end();
      for (;;) {
        Body body = parse_body({"elif", "else", "endif"}, end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        const Chunk& e = chunks_[pos_++];
        if (end == "elif") {
          ExprParser ep(e.content, e.line, where(e.line));
          ep.expect_name();
          cond = ep.expression();
          ep.expect_end();
          continue;
        }
        if (end == "else") {
          s->else_body = parse_body({"endif"}, end);
          ++pos_;
        }
        break;
      }
    } else if (k == "for") {
      s->kind = StmtKind::kFor;
      s->targets.push_back(p.expect_name());
      while (p.is_op(",")) {
        p.next();
        s->targets.push_back(p.expect_name());
      }
      ST_CHECK(p.is_name("in"), at, ": expected `in` in the for loop");
      p.next();
      s->expr = p.tuple(false);
      if (p.is_name("if")) {
        p.next();
        s->filter = p.expression(false);
      }
      ST_CHECK(!p.is_name("recursive"), at, ": recursive for loops are not supported");
      p.expect_end();
      s->body = parse_body({"else", "endfor"}, end);
      ++pos_;
      if (end == "else") {
        s->else_body = parse_body({"endfor"}, end);
        ++pos_;
      }
    } else if (k == "set") {
      s->kind = StmtKind::kSet;
      s->targets.push_back(p.expect_name());
      if (p.is_op(".")) {
        p.next();
        s->attribute = p.expect_name();
      } else {
        while (p.is_op(",")) {
          p.next();
          s->targets.push_back(p.expect_name());
        }
      }
      if (p.is_op("=")) {
        p.next();
        s->expr = p.tuple();
        p.expect_end();
      } else {  // {% set name %}...{% endset %}
        p.expect_end();
        ST_CHECK(s->targets.size() == 1, at, ": a block set takes one name");
        s->body = parse_body({"endset"}, end);
        ++pos_;
      }
    } else if (k == "macro") {
      s->kind = StmtKind::kMacro;
      s->name = p.expect_name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        std::string param = p.expect_name();
        ExprPtr fallback;
        if (p.is_op("=")) {
          p.next();
          fallback = p.expression();
        }
        s->params.emplace_back(std::move(param), std::move(fallback));
        if (!p.is_op(",")) break;
        p.next();
      }
      p.expect_op(")");
      p.expect_end();
      s->body = parse_body({"endmacro"}, end);
      ++pos_;
    } else if (k == "generation") {
      s->kind = StmtKind::kGeneration;
      p.expect_end();
      s->body = parse_body({"endgeneration"}, end);
      ++pos_;
    } else if (k == "break" || k == "continue") {
      s->kind = k == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      p.expect_end();
    } else {
      ST_THROW(at, ": `{% ", k, " %}` is not supported (chat templates use if, for, set, macro, break, continue and "
               "generation)");
    }
    return s;
  }

  static constexpr int kMaxDepth = 100;
  std::vector<Chunk> chunks_;
  std::string name_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source, const std::string& name) {
  // jinja2 drops one newline at the end of the source (keep_trailing_newline is off)
  if (source.size() >= 2 && source.substr(source.size() - 2) == "\r\n") {
    source.remove_suffix(2);
  } else if (!source.empty() && source.back() == '\n') {
    source.remove_suffix(1);
  }
  return StmtParser(scan(source, name), name).parse();
}

}  // namespace shardtrain::data::jinja
