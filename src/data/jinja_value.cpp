// Jinja values: construction, Python's truth and str(), and json.dumps as tojson calls it.
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/jinja.h"

namespace shardtrain::data::jinja {

const Value* Value::Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Value::Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::string(std::string s, int tag) {
  std::vector<Segment> segments;
  if (tag >= 0 && !s.empty()) segments.push_back({0, s.size(), tag});
  return string(std::move(s), std::move(segments));
}

Value Value::string(std::string s, std::vector<Segment> segments) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  v.segments_ = std::move(segments);
  return v;
}

Value Value::list() { return list(List()); }

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.name_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

namespace {

template <class Json>
Value value_of_json(const Json& j, int tag) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>(), tag);
    case nlohmann::json::value_t::array: {
      Value::List items;
      for (const Json& e : j) items.push_back(value_of_json(e, tag));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value::Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(it.key(), value_of_json(it.value(), tag));
      return Value::dict(std::move(d));
    }
    default: ST_THROW("jinja: JSON value of type ", j.type_name(), " has no template value");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j, int tag) { return value_of_json(j, tag); }
Value Value::from_json(const nlohmann::ordered_json& j, int tag) { return value_of_json(j, tag); }

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  if (kind_ == Kind::kList) return list_ == other.list_;
  if (kind_ == Kind::kDict) return dict_ == other.dict_;
  return false;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_.empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->entries.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

Value Call::arg(size_t index, const char* name, Value fallback) const {
  for (const auto& [k, v] : kwargs)
    if (name != nullptr && k == name) return v;
  return index < args.size() ? args[index] : fallback;
}

namespace {

// Python's repr() of a float: the shortest digits that round-trip, fixed notation for
// exponents in [-4, 16), else d.ddde+XX.
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  const size_t e_pos = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e_pos; ++i)
    if (sci[i] != '.') digits += sci[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string whole = digits.substr(0, std::min(digits.size(), static_cast<size_t>(exponent) + 1));
      whole.resize(static_cast<size_t>(exponent) + 1, '0');
      const std::string frac = digits.size() > static_cast<size_t>(exponent) + 1 ? digits.substr(exponent + 1) : "0";
      out += whole;
      out += '.';
      out += frac;
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1, std::string::npos);
  }
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

// Python's repr() of a string (the quotes it picks and the escapes of control characters).
std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string repr(const Value& v) { return v.is_string() ? string_repr(v.str()) : to_python_string(v); }

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Throws where `out` would pass `max_bytes` by `more` bytes (before they are allocated).
void check_json_size(const std::string& out, size_t more, size_t max_bytes) {
  if (out.size() + more > max_bytes)
    ST_THROW("tojson: the JSON would pass ", max_bytes, " bytes");
}

void json_value(std::string& out, const Value& v, int indent, int level, size_t max_bytes) {
  const auto newline = [&](int at) {
    if (indent < 0) return;
    const size_t pad = static_cast<size_t>(indent) * static_cast<size_t>(at);
    check_json_size(out, 1 + pad, max_bytes);
    out += '\n';
    out.append(pad, ' ');
  };
  check_json_size(out, 0, max_bytes);
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = v.as_double();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : float_repr(f);
      return;
    }
    case Value::Kind::kString:
      check_json_size(out, v.str().size() + 2, max_bytes);  // quotes; escapes only add
      json_string(out, v.str());
      check_json_size(out, 0, max_bytes);
      return;
    case Value::Kind::kList: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        json_value(out, v.items()[i], indent, level + 1, max_bytes);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.entries().entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.entries().entries) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json_string(out, k);
        out += ": ";
        json_value(out, e, indent, level + 1, max_bytes);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      ST_THROW("tojson: a ", v.type_name(), " value is not JSON serializable");
  }
}

}  // namespace

std::string to_python_string(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return float_repr(v.as_double());
    case Value::Kind::kString: return v.str();
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.items().size(); ++i) out += (i > 0 ? ", " : "") + repr(v.items()[i]);
      if (v.is_tuple() && v.items().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.entries().entries) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + repr(e);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::kFunction: return "<function " + v.name() + ">";
  }
  return "";
}

std::string to_json(const Value& v, int indent, size_t max_bytes) {
  std::string out;
  json_value(out, v, indent, 0, max_bytes);
  check_json_size(out, 0, max_bytes);
  return out;
}

}  // namespace shardtrain::data::jinja
