// The Jinja interpreter's operations on values: Python's arithmetic, comparisons and
// containment, attribute and item access with jinja2's lookup order, string and dict methods,
// and the filters and tests chat templates use. String results keep the provenance of the
// bytes they take from their inputs (slices, strips, joins).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/jinja_internal.h"

namespace shardtrain::data::jinja {

// Byte offsets of a UTF-8 string's code points, and its size at the end.
std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

// Bytes [begin, end) of a string value, its provenance clipped to them.
Value substring(const Value& v, size_t begin, size_t end) {
  std::vector<Segment> segments;
  // the first segment that ends past `begin` (they are in order), so that taking a long
  // string's characters one by one stays linear
  auto it = std::upper_bound(v.segments().begin(), v.segments().end(), begin,
                             [](size_t at, const Segment& s) { return at < s.end; });
  for (; it != v.segments().end() && it->begin < end; ++it) {
    const size_t a = std::max(it->begin, begin), b = std::min(it->end, end);
    if (a < b) segments.push_back({a - begin, b - begin, it->tag});
  }
  return Value::string(v.str().substr(begin, end - begin), std::move(segments));
}

void check_string(size_t now, size_t more) {
  if (more > kMaxString - std::min(now, kMaxString))
    throw StringLimit("a string would pass " + std::to_string(kMaxString) + " bytes");
}

void StringBuilder::append(const Value& piece) {
  check_string(text_.size(), piece.str().size());
  for (const Segment& s : piece.segments())
    segments_.push_back({s.begin + text_.size(), s.end + text_.size(), s.tag});
  text_ += piece.str();
}

Value concat(const Value& a, const Value& b) {
  StringBuilder out;
  out.append(a);
  out.append(b);
  return out.take();
}

bool is_python_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// str.strip / lstrip / rstrip: whitespace (ASCII and the Unicode spaces Python's isspace
// knows in UTF-8), or the characters of `chars`.
Value strip(const Value& v, bool left, bool right, const Value& chars) {
  const std::string& s = v.str();
  const std::vector<size_t> cp = code_points(s);
  const std::vector<size_t> chars_cp = chars.is_string() ? code_points(chars.str()) : std::vector<size_t>{};
  auto strippable = [&](size_t k) {  // code point k of s
    const std::string c = s.substr(cp[k], cp[k + 1] - cp[k]);
    if (chars.is_string()) {
      for (size_t j = 0; j + 1 < chars_cp.size(); ++j)
        if (chars.str().compare(chars_cp[j], chars_cp[j + 1] - chars_cp[j], c) == 0) return true;
      return false;
    }
    if (c.size() == 1) return is_python_space(static_cast<unsigned char>(c[0]));
    static const char* const kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
                                          "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                          "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
    for (const char* sp : kSpaces)
      if (c == sp) return true;
    return false;
  };
  size_t first = 0, last = cp.size() - 1;  // code point range [first, last)
  if (left)
    while (first < last && strippable(first)) ++first;
  if (right)
    while (last > first && strippable(last - 1)) --last;
  return substring(v, cp[first], cp[last]);
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() || a.kind() == Value::Kind::kBool) {
    if (!(b.is_number() || b.kind() == Value::Kind::kBool)) return false;
    const double x = a.kind() == Value::Kind::kBool ? a.as_bool() : a.as_double();
    const double y = b.kind() == Value::Kind::kBool ? b.as_bool() : b.as_double();
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) {
      const int64_t i = a.kind() == Value::Kind::kBool ? a.as_bool() : a.as_int();
      const int64_t j = b.kind() == Value::Kind::kBool ? b.as_bool() : b.as_int();
      return i == j;
    }
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList:
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equal(a.items()[i], b.items()[i])) return false;
      return true;
    case Value::Kind::kDict:
      if (a.entries().entries.size() != b.entries().entries.size()) return false;
      for (const auto& [k, v] : a.entries().entries) {
        const Value* w = b.entries().find(k);
        if (w == nullptr || !equal(v, *w)) return false;
      }
      return true;
    case Value::Kind::kFunction: return a.same_object(b);
    default: return false;
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

size_t code_index(const std::string& s, size_t byte) {
  size_t n = 0;
  for (size_t i = 0; i < byte; ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  return n;
}

bool numeric(const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; }
double as_number(const Value& v) { return v.kind() == Value::Kind::kBool ? v.as_bool() : v.as_double(); }
int64_t as_integer(const Value& v) { return v.kind() == Value::Kind::kBool ? v.as_bool() : v.as_int(); }

bool both_integers(const Value& a, const Value& b) {
  return a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat;
}

constexpr int64_t kMaxRepeat = int64_t{1} << 24;  // bytes or items a `*` may make

}  // namespace

void Operations::fail(int line, const std::string& message) const {
  ST_THROW("`", name_, "` line ", line, ": ", message);
}

std::string Operations::where(int line) const { return "`" + name_ + "` line " + std::to_string(line); }

// The values a for loop visits: a list's items, a dict's keys, a string's characters.
std::vector<Value> Operations::iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, e] : v.entries().entries) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::vector<size_t> cp = code_points(v.str());
      for (size_t i = 0; i + 1 < cp.size(); ++i) chars.push_back(substring(v, cp[i], cp[i + 1]));
      return chars;
    }
    default: fail(line, "cannot iterate over a " + v.type_name());
  }
}


Value Operations::method(const Value& self, const std::string& name) {
  Value bound = self;
  if (self.is_string()) {
    static const char* const kMethods[] = {"strip",    "lstrip",     "rstrip", "split",   "startswith", "endswith",
                                           "upper",    "lower",      "title",  "replace", "find",       "count",
                                           "join",     "capitalize", "format", "splitlines"};
    if (std::find_if(std::begin(kMethods), std::end(kMethods), [&](const char* m) { return name == m; }) ==
        std::end(kMethods))
      return Value::undefined(name);
    return Value::function("str." + name, [this, bound, name](Call& c) { return string_method(bound, name, c); });
  }
  if (self.kind() == Value::Kind::kDict && !self.entries().is_namespace) {
    if (name != "items" && name != "keys" && name != "values" && name != "get") return Value::undefined(name);
    return Value::function("dict." + name, [bound, name](Call& c) {
      if (name == "get") {
        const Value key = c.arg(0, "key");
        const Value* v = key.is_string() ? bound.entries().find(key.str()) : nullptr;
        return v != nullptr ? *v : c.arg(1, "default", Value::none());
      }
      Value::List out;
      for (const auto& [k, v] : bound.entries().entries) {
        if (name == "items") out.push_back(Value::tuple({Value::string(k), v}));
        if (name == "keys") out.push_back(Value::string(k));
        if (name == "values") out.push_back(v);
      }
      return Value::list(std::move(out));
    });
  }
  return Value::undefined(name);
}

Value Operations::string_method(const Value& s, const std::string& name, Call& c) {
  auto str_arg = [&](size_t i, const char* n) {
    const Value v = c.arg(i, n);
    ST_CHECK(v.is_string(), c.where, ": str.", name, "() takes a string, given a ", v.type_name());
    return v.str();
  };
  if (name == "strip") return strip(s, true, true, c.arg(0, "chars"));
  if (name == "lstrip") return strip(s, true, false, c.arg(0, "chars"));
  if (name == "rstrip") return strip(s, false, true, c.arg(0, "chars"));
  if (name == "upper" || name == "lower") {
    std::string out = s.str();
    for (char& ch : out) ch = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(ch))
                                                               : std::tolower(static_cast<unsigned char>(ch)));
    return Value::string(out);
  }
  if (name == "title" || name == "capitalize") return filter(name, s, c, 0);
  if (name == "startswith" || name == "endswith") {
    const Value p = c.arg(0, "prefix");
    std::vector<std::string> options;
    if (p.is_string()) options.push_back(p.str());
    if (p.kind() == Value::Kind::kList)
      for (const Value& o : p.items()) options.push_back(o.str());
    for (const std::string& o : options) {
      const std::string& t = s.str();
      if (o.size() <= t.size() && (name == "startswith" ? t.compare(0, o.size(), o) == 0
                                                        : t.compare(t.size() - o.size(), o.size(), o) == 0))
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "replace") return filter("replace", s, c, 0);
  if (name == "find" || name == "count") {
    const std::string sub = str_arg(0, "sub");
    if (name == "find") {
      const size_t at = s.str().find(sub);
      return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_index(s.str(), at)));
    }
    if (sub.empty()) return Value::integer(static_cast<int64_t>(code_points(s.str()).size()));
    int64_t n = 0;
    for (size_t at = s.str().find(sub); at != std::string::npos; at = s.str().find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    StringBuilder out;
    bool first = true;
    for (const Value& v : iterate(c.arg(0, "iterable"), 0)) {
      if (!first) out.append(s);
      first = false;
      out.append(v.is_string() ? v : Value::string(to_python_string(v)));
    }
    return out.take();
  }
  if (name == "split" || name == "splitlines") {
    Value::List parts;
    const std::string& t = s.str();
    const Value sep = name == "split" ? c.arg(0, "sep") : Value::string("\n");
    int64_t max_split = name == "split" && c.arg(1, "maxsplit").kind() == Value::Kind::kInt
                            ? c.arg(1, "maxsplit").as_int()
                            : -1;
    if (sep.is_string() && !sep.str().empty()) {
      size_t from = 0;
      for (size_t at = t.find(sep.str()); at != std::string::npos && max_split != 0; at = t.find(sep.str(), from)) {
        parts.push_back(substring(s, from, at));
        from = at + sep.str().size();
        --max_split;
      }
      if (name == "split" || from < t.size()) parts.push_back(substring(s, from, t.size()));
    } else {  // runs of whitespace
      size_t i = 0;
      while (i < t.size()) {
        while (i < t.size() && is_python_space(static_cast<unsigned char>(t[i]))) ++i;
        if (i == t.size()) break;
        size_t j = i;
        if (max_split == 0) {
          j = t.size();
          while (j > i && is_python_space(static_cast<unsigned char>(t[j - 1]))) --j;
        } else {
          while (j < t.size() && !is_python_space(static_cast<unsigned char>(t[j]))) ++j;
        }
        parts.push_back(substring(s, i, j));
        --max_split;
        i = j;
      }
    }
    return Value::list(std::move(parts));
  }
  ST_THROW(c.where, ": str.", name, "() is not supported");
}


Value Operations::attribute(const Value& obj, const std::string& name, int line, const std::string& what) {
  if (obj.is_undefined()) fail(line, "`" + what + "` is undefined, so it has no attribute `" + name + "`");
  if (obj.kind() == Value::Kind::kDict) {
    const Value m = method(obj, name);  // jinja2 looks for an attribute first, then an item
    if (!m.is_undefined()) return m;
    if (const Value* v = obj.entries().find(name)) return *v;
    return Value::undefined(what + "." + name);
  }
  if (obj.is_string()) return method(obj, name);
  return Value::undefined(what + "." + name);
}

Value Operations::item(const Value& obj, const Value& key, int line, const std::string& what) {
  if (obj.is_undefined()) fail(line, "`" + what + "` is undefined, so it has no item");
  if (obj.kind() == Value::Kind::kDict) {
    if (key.is_string()) {
      if (const Value* v = obj.entries().find(key.str())) return *v;
      return method(obj, key.str());
    }
    return Value::undefined(what + "[...]");
  }
  if ((obj.kind() == Value::Kind::kList || obj.is_string()) &&
      (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
    const int64_t k = key.kind() == Value::Kind::kBool ? key.as_bool() : key.as_int();
    if (obj.kind() == Value::Kind::kList) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      const int64_t i = k < 0 ? k + n : k;
      return i >= 0 && i < n ? obj.items()[static_cast<size_t>(i)] : Value::undefined(what + "[...]");
    }
    const std::vector<size_t> cp = code_points(obj.str());
    const int64_t n = static_cast<int64_t>(cp.size()) - 1;
    const int64_t i = k < 0 ? k + n : k;
    return i >= 0 && i < n ? substring(obj, cp[static_cast<size_t>(i)], cp[static_cast<size_t>(i) + 1])
                           : Value::undefined(what + "[...]");
  }
  if (key.is_string()) return attribute(obj, key.str(), line, what);
  return Value::undefined(what + "[...]");
}



Value Operations::binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    const Value x = a.is_string() ? a : Value::string(to_python_string(a));
    const Value y = b.is_string() ? b : Value::string(to_python_string(b));
    return concat(x, y);
  }
  auto unsupported = [&]() -> Value {
    fail(line, "unsupported operand types for " + op + ": " + a.type_name() + " and " + b.type_name() +
                   (a.is_undefined() || b.is_undefined() ? " (an undefined value)" : ""));
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return concat(a, b);
    if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList) {
      Value::List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out));
    }
  }
  if (op == "*" && (a.is_string() || a.kind() == Value::Kind::kList || b.is_string() ||
                    b.kind() == Value::Kind::kList)) {
    const Value& seq = a.is_string() || a.kind() == Value::Kind::kList ? a : b;
    const Value& count = &seq == &a ? b : a;
    if (count.kind() != Value::Kind::kInt && count.kind() != Value::Kind::kBool) return unsupported();
    const int64_t n = std::max<int64_t>(0, as_integer(count));
    const int64_t size =
        seq.is_string() ? static_cast<int64_t>(seq.str().size()) : static_cast<int64_t>(seq.items().size());
    if (size > 0 && n > kMaxRepeat / size)
      fail(line, "`*` would make more than " + std::to_string(kMaxRepeat) + " bytes or items");
    if (seq.is_string()) {
      StringBuilder out;
      for (int64_t i = 0; i < n; ++i) out.append(seq);
      return out.take();
    }
    Value::List out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
    return Value::list(std::move(out));
  }
  if (!numeric(a) || !numeric(b)) return unsupported();
  const bool ints = both_integers(a, b);
  const double x = as_number(a), y = as_number(b);
  const int64_t i = ints ? as_integer(a) : 0, j = ints ? as_integer(b) : 0;
  int64_t r = 0;
  auto overflow = [&]() -> Value { fail(line, "integer " + op + " overflows 64 bits"); };
  if (op == "+") {
    if (!ints) return Value::number(x + y);
    return __builtin_add_overflow(i, j, &r) ? overflow() : Value::integer(r);
  }
  if (op == "-") {
    if (!ints) return Value::number(x - y);
    return __builtin_sub_overflow(i, j, &r) ? overflow() : Value::integer(r);
  }
  if (op == "*") {
    if (!ints) return Value::number(x * y);
    return __builtin_mul_overflow(i, j, &r) ? overflow() : Value::integer(r);
  }
  if (op == "/") {
    if (y == 0) fail(line, "division by zero");
    return Value::number(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) fail(line, op == "//" ? "integer division by zero" : "modulo by zero");
    if (ints) {
      if (i == INT64_MIN && j == -1) return overflow();
      int64_t q = i / j, m = i % j;
      if (m != 0 && ((m < 0) != (j < 0))) {  // Python's: the remainder takes the divisor's sign
        --q;
        m += j;
      }
      return Value::integer(op == "//" ? q : m);
    }
    const double q = std::floor(x / y);
    return Value::number(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (ints && j >= 0) {
      int64_t p = 1, base = i;
      for (int64_t e = j; e > 0; e >>= 1) {  // by squaring: at most 63 rounds
        if ((e & 1) != 0 && __builtin_mul_overflow(p, base, &p)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::integer(p);
    }
    return Value::number(std::pow(x, y));
  }
  return unsupported();
}

bool Operations::contains(const Value& container, const Value& v, int line) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!v.is_string()) fail(line, "`in <string>` needs a string on the left, found a " + v.type_name());
      return container.str().find(v.str()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& x) { return equal(x, v); });
    case Value::Kind::kDict: return v.is_string() && container.entries().find(v.str()) != nullptr;
    default: fail(line, "`in` needs a string, list or dict on the right, found a " + container.type_name());
  }
}

bool Operations::compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a, line);
  if (op == "not in") return !contains(b, a, line);
  int order = 0;
  if (numeric(a) && numeric(b)) {
    const double x = as_number(a), y = as_number(b);
    order = x < y ? -1 : x > y ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    order = a.str().compare(b.str());
  } else {
    fail(line, "cannot order a " + a.type_name() + " and a " + b.type_name() + " with " + op);
  }
  if (op == "<") return order < 0;
  if (op == "<=") return order <= 0;
  if (op == ">") return order > 0;
  return order >= 0;
}

// ---------------------------------------------------------------------------- tests

bool Operations::test(const std::string& name, const Value& v, const Call& c, int line) {
  const Value arg = c.args.empty() ? Value() : c.args[0];
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "number") return v.is_number() || v.kind() == Value::Kind::kBool;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Value::Kind::kDict;
  if (name == "iterable") return v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kDict || v.is_string();
  if (name == "sequence")
    return v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kDict || v.is_string();
  if (name == "callable") return v.kind() == Value::Kind::kFunction;
  if (name == "sameas") return v.same_object(arg) || (v.kind() == arg.kind() && !v.is_string() && equal(v, arg));
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg);
  if (name == "ne" || name == "!=") return !equal(v, arg);
  if (name == "lt" || name == "lessthan" || name == "<") return compare("<", v, arg, line);
  if (name == "le" || name == "<=") return compare("<=", v, arg, line);
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(">", v, arg, line);
  if (name == "ge" || name == ">=") return compare(">=", v, arg, line);
  if (name == "in") return contains(arg, v, line);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != Value::Kind::kInt) fail(line, "`is " + name + "` of a " + v.type_name());
    if (name == "divisibleby") {
      if (arg.kind() != Value::Kind::kInt || arg.as_int() == 0) fail(line, "`is divisibleby` needs a non-zero integer");
      return v.as_int() % arg.as_int() == 0;
    }
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    bool cased = false;
    for (const char ch : v.str()) {
      if (std::isalpha(static_cast<unsigned char>(ch))) cased = true;
      if (name == "lower" ? std::isupper(static_cast<unsigned char>(ch)) : std::islower(static_cast<unsigned char>(ch)))
        return false;
    }
    return cased;
  }
  fail(line, "unknown test `" + name + "`");
}

// ---------------------------------------------------------------------------- filters

Value Operations::filter(const std::string& name, const Value& v, Call& c, int line) {
  const Value arg = c.args.empty() ? Value() : c.args[0];
  auto need_string = [&]() {
    if (!v.is_string()) fail(line, "filter `" + name + "` needs a string, found a " + v.type_name());
  };
  if (name == "trim") {
    need_string();
    return strip(v, true, true, c.arg(0, "chars"));
  }
  if (name == "length" || name == "count") {
    switch (v.kind()) {
      case Value::Kind::kString: return Value::integer(static_cast<int64_t>(code_points(v.str()).size()) - 1);
      case Value::Kind::kList: return Value::integer(static_cast<int64_t>(v.items().size()));
      case Value::Kind::kDict: return Value::integer(static_cast<int64_t>(v.entries().entries.size()));
      case Value::Kind::kUndefined: return Value::integer(0);
      default: fail(line, "a " + v.type_name() + " has no length");
    }
  }
  if (name == "tojson") {
    const Value indent = c.arg(0, "indent");
    // json.dumps: a negative indent inserts newlines only, as 0 does
    const bool by_int = indent.kind() == Value::Kind::kInt;
    if (by_int && indent.as_int() > 1000)
      fail(line, "tojson() indent must be at most 1000, found " + std::to_string(indent.as_int()));
    try {
      return Value::string(to_json(v, by_int ? static_cast<int>(std::max<int64_t>(indent.as_int(), 0)) : -1,
                                   kMaxString));
    } catch (const Error& e) {
      fail(line, e.what());
    }
  }
  if (name == "string") return v.is_string() ? v : Value::string(to_python_string(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value::string(html_escape(to_python_string(v)));
  if (name == "upper" || name == "lower") {
    need_string();
    return string_method(v, name, c);
  }
  if (name == "title" || name == "capitalize") {
    need_string();
    std::string out = v.str();
    bool start = true;
    for (char& ch : out) {
      const unsigned char u = static_cast<unsigned char>(ch);
      if (name == "capitalize") {
        ch = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        ch = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = !std::isalnum(u) && (u & 0x80) == 0;
      }
    }
    return Value::string(out);
  }
  if (name == "replace") {
    need_string();
    const Value old = c.arg(0, "old"), with = c.arg(1, "new"), count = c.arg(2, "count");
    if (!old.is_string() || !with.is_string()) fail(line, "replace() takes two strings");
    int64_t left = count.kind() == Value::Kind::kInt ? count.as_int() : -1;
    std::string out;
    const std::string& s = v.str();
    size_t from = 0;
    if (old.str().empty()) {
      const std::vector<size_t> cp = code_points(s);
      for (size_t i = 0; i + 1 < cp.size(); ++i) {
        if (left != 0) {
          check_string(out.size(), with.str().size());
          out += with.str();
          --left;
        }
        out += s.substr(cp[i], cp[i + 1] - cp[i]);
      }
      if (left != 0) {
        check_string(out.size(), with.str().size());
        out += with.str();
      }
      return Value::string(out);
    }
    for (size_t at = s.find(old.str()); at != std::string::npos && left != 0; at = s.find(old.str(), from)) {
      check_string(out.size(), at - from + with.str().size());
      out += s.substr(from, at - from) + with.str();
      from = at + old.str().size();
      --left;
    }
    check_string(out.size(), s.size() - from);
    return Value::string(out + s.substr(from));
  }
  if (name == "default" || name == "d") {
    const bool boolean = c.arg(1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return c.arg(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "first" || name == "last") {
    const std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(v, line));
  if (name == "reverse") {
    if (v.is_string()) {
      StringBuilder out;
      const std::vector<Value> chars = iterate(v, line);
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(*it);
      return out.take();
    }
    std::vector<Value> items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    Value::List out;
    for (const Value& x : iterate(v, line))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value::list(std::move(out));
  }
  if (name == "int") {
    if (v.kind() == Value::Kind::kInt) return v;
    if (numeric(v)) return Value::integer(static_cast<int64_t>(as_number(v)));
    if (v.is_string()) {
      try {
        size_t used = 0;
        const int64_t i = std::stoll(v.str(), &used);  // out of range: the default, as below
        if (used == v.str().size()) return Value::integer(i);
      } catch (const std::exception&) {
      }
    }
    return c.arg(0, "default", Value::integer(0));
  }
  if (name == "float") {
    if (numeric(v)) return Value::number(as_number(v));
    if (v.is_string()) {
      try {
        return Value::number(std::stod(v.str()));
      } catch (const std::exception&) {
      }
    }
    return c.arg(0, "default", Value::number(0));
  }
  if (name == "abs") {
    if (!numeric(v)) fail(line, "abs of a " + v.type_name());
    return v.kind() == Value::Kind::kFloat ? Value::number(std::fabs(v.as_double()))
                                           : Value::integer(std::llabs(as_integer(v)));
  }
  if (name == "round") {
    if (!numeric(v)) fail(line, "round of a " + v.type_name());
    const int64_t digits = c.arg(0, "precision").kind() == Value::Kind::kInt ? c.arg(0, "precision").as_int() : 0;
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Value::number(std::nearbyint(as_number(v) * scale) / scale);  // Python's round: halves to even
  }
  if (name == "join") {
    const Value sep = c.arg(0, "d", Value::string(""));
    const Value attr = c.arg(1, "attribute");
    const Value sep_text = sep.is_string() ? sep : Value::string(to_python_string(sep));
    StringBuilder out;
    bool first = true;
    for (const Value& x : iterate(v, line)) {
      if (!first) out.append(sep_text);
      first = false;
      const Value y = attr.is_undefined() ? x : attribute_path(x, attr, line);
      out.append(y.is_string() ? y : Value::string(to_python_string(y)));
    }
    return out.take();
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list();
    if (v.kind() != Value::Kind::kDict) fail(line, "filter `items` needs a dict, found a " + v.type_name());
    Value::List out;
    for (const auto& [k, e] : v.entries().entries) out.push_back(Value::tuple({Value::string(k), e}));
    return Value::list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_match = name == "select" || name == "selectattr";
    Value::List out;
    for (const Value& x : iterate(v, line)) {
      Call tc;
      tc.where = c.where;
      size_t first = 0;
      Value subject = x;
      if (by_attr) {
        if (c.args.empty()) fail(line, "filter `" + name + "` needs an attribute name");
        subject = attribute_path(x, c.args[0], line);
        first = 1;
      }
      bool match = false;
      if (c.args.size() <= first) {
        match = subject.truthy();
      } else {
        if (!c.args[first].is_string()) fail(line, "filter `" + name + "` needs a test name");
        tc.args.assign(c.args.begin() + static_cast<std::ptrdiff_t>(first) + 1, c.args.end());
        match = test(c.args[first].str(), subject, tc, line);
      }
      if (match == keep_match) out.push_back(x);
    }
    return Value::list(std::move(out));
  }
  if (name == "map") {
    Value::List out;
    const Value attr = c.arg(99, "attribute");
    for (const Value& x : iterate(v, line)) {
      if (!attr.is_undefined()) {
        Value y = attribute_path(x, attr, line);
        if (y.is_undefined()) y = c.arg(99, "default", y);
        out.push_back(y);
        continue;
      }
      if (c.args.empty() || !c.args[0].is_string()) fail(line, "filter `map` needs a filter name or attribute=");
      Call fc;
      fc.where = c.where;
      fc.args.assign(c.args.begin() + 1, c.args.end());
      out.push_back(filter(c.args[0].str(), x, fc, line));
    }
    return Value::list(std::move(out));
  }
  if (name == "indent") {
    need_string();
    const Value width = c.arg(0, "width", Value::integer(4));
    if (!width.is_string() && (width.kind() != Value::Kind::kInt || width.as_int() < 0 || width.as_int() > 1000))
      fail(line, "indent() width must be a string or an integer in [0, 1000]");
    const std::string pad = width.is_string() ? width.str() : std::string(static_cast<size_t>(width.as_int()), ' ');
    const bool first = c.arg(1, "first").truthy(), blank = c.arg(2, "blank").truthy();
    std::string out;
    const std::string& s = v.str();
    size_t line_start = 0;
    bool first_line = true;
    while (line_start <= s.size()) {
      size_t nl = s.find('\n', line_start);
      const std::string text = s.substr(line_start, nl == std::string::npos ? std::string::npos : nl - line_start);
      if ((!first_line || first) && (blank || !text.empty())) {
        check_string(out.size(), pad.size());
        out += pad;
      }
      check_string(out.size(), text.size() + 1);
      out += text;
      if (nl == std::string::npos) break;
      out += '\n';
      line_start = nl + 1;
      first_line = false;
    }
    return Value::string(out);
  }
  if (name == "sum") {
    double total = 0;
    bool ints = true;
    int64_t itotal = 0;
    for (const Value& x : iterate(v, line)) {
      if (!numeric(x)) fail(line, "sum of a list holding a " + x.type_name());
      ints = ints && x.kind() != Value::Kind::kFloat;
      total += as_number(x);
      itotal += ints ? as_integer(x) : 0;
    }
    return ints ? Value::integer(itotal) : Value::number(total);
  }
  if (name == "max" || name == "min") {
    const std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const Value& x : items)
      if (compare(name == "max" ? ">" : "<", x, best, line)) best = x;
    return best;
  }
  fail(line, "unknown filter `" + name + "`");
}

// `x.a.b` for an attribute argument "a.b" (or an integer index).
Value Operations::attribute_path(const Value& x, const Value& path, int line) {
  if (path.kind() == Value::Kind::kInt) return item(x, path, line, "item");
  if (!path.is_string()) fail(line, "an attribute name must be a string");
  Value cur = x;
  size_t from = 0;
  for (;;) {
    const size_t dot = path.str().find('.', from);
    const std::string part = path.str().substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (cur.is_undefined()) return cur;
    cur = cur.kind() == Value::Kind::kDict && cur.entries().find(part) != nullptr ? *cur.entries().find(part)
                                                                                   : Value::undefined(part);
    if (dot == std::string::npos) return cur;
    from = dot + 1;
  }
}

}  // namespace shardtrain::data::jinja
