// The Jinja renderer: statements over a stack of scopes (a for loop's body and a macro's have
// their own, as in jinja2) and expressions with jinja2's undefined values; the operations on
// values are jinja_builtins.cpp's. String results keep the provenance of their bytes.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "data/jinja_internal.h"

namespace shardtrain::data::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer final : public Operations {
 public:
  Renderer(const std::string& name, const Value& context, size_t max_output)
      : Operations(name), max_output_(max_output), context_(context) {
    scopes_.emplace_back();
  }

  Rendered run(const Body& body) {
    (void)render(body);
    return std::move(out_);
  }

 private:
  using Scope = std::map<std::string, Value>;

  // Text about to join the output (captured text of macros and block sets counts while it is there).
  void grow(size_t bytes, int line) const {
    if (out_.text.size() + bytes > max_output_)
      fail(line, "the output would pass " + std::to_string(max_output_) + " bytes");
  }

  void write(const Value& v, int line) {
    if (v.is_undefined()) return;
    if (!v.is_string()) {
      const std::string text = to_python_string(v);
      grow(text.size(), line);
      out_.text += text;
      return;
    }
    grow(v.str().size(), line);
    for (const Segment& s : v.segments())
      out_.segments.push_back({s.begin + out_.text.size(), s.end + out_.text.size(), s.tag});
    out_.text += v.str();
  }

  Flow render(const Body& body) {
    for (const auto& s : body) {
      const Flow f = statement(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  Value lookup(const std::string& name, int line) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (context_.kind() == Value::Kind::kDict)
      if (const Value* v = context_.entries().find(name)) return *v;
    if (name == "range") return builtin_range();
    if (name == "namespace" || name == "dict") return builtin_dict(name == "namespace");
    (void)line;
    return Value::undefined(name);
  }

  Flow statement(const Stmt& s) {
    switch (s.kind) {
      case StmtKind::kText:
        grow(s.text.size(), s.line);
        out_.text += s.text;
        return Flow::kNormal;
      case StmtKind::kOutput: write(eval(*s.expr), s.line); return Flow::kNormal;
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return render(body);
        return render(s.else_body);
      case StmtKind::kFor: return for_loop(s);
      case StmtKind::kSet: {
        Value v;
        if (s.expr) {
          v = eval(*s.expr);
        } else {  // a block set: the body's text
          const Mark mark = this->mark();
          (void)render(s.body);
          v = take_since(mark);
        }
        if (!s.attribute.empty()) {
          Value target = lookup(s.targets[0], s.line);
          if (target.kind() != Value::Kind::kDict || !target.entries().is_namespace)
            fail(s.line, "cannot set attribute `" + s.attribute + "` of `" + s.targets[0] + "`, which is a " +
                             target.type_name() + ", not a namespace()");
          target.mutable_entries().set(s.attribute, std::move(v));
        } else if (s.targets.size() == 1) {
          assign(s.targets[0], std::move(v));
        } else {
          unpack(s.targets, v, s.line);
        }
        return Flow::kNormal;
      }
      case StmtKind::kMacro: {
        assign(s.name, macro(s));
        return Flow::kNormal;
      }
      case StmtKind::kGeneration: {
        const size_t begin = out_.text.size();
        const Flow f = render(s.body);
        out_.generation.emplace_back(begin, out_.text.size());
        return f;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void unpack(const std::vector<std::string>& targets, const Value& v, int line) {
    if (v.kind() != Value::Kind::kList || v.items().size() != targets.size())
      fail(line, "cannot unpack a " + v.type_name() + " into " + std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], v.items()[i]);
  }

  Flow for_loop(const Stmt& s) {
    std::vector<Value> items = iterate(eval(*s.expr), s.line);
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(s, item);
        if (eval(*s.filter).truthy()) kept.push_back(item);
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) return render(s.else_body);
    const int64_t n = static_cast<int64_t>(items.size());
    // one loop.cycle for the whole loop, reading the iteration it is called in
    const auto index = std::make_shared<int64_t>(0);
    const Value cycle = Value::function("loop.cycle", [index](Call& c) {
      if (c.args.empty()) return Value::undefined("cycle");
      return c.args[static_cast<size_t>(*index) % c.args.size()];
    });
    for (int64_t i = 0; i < n; ++i) {
      if (++iterations_ > kMaxIterations)
        fail(s.line, "loops ran more than " + std::to_string(kMaxIterations) + " iterations");
      scopes_.emplace_back();
      bind(s, items[static_cast<size_t>(i)]);
      Value::Dict loop;  // its keys are distinct: appended without Dict::set's search
      loop.entries.reserve(10);
      loop.entries.emplace_back("index", Value::integer(i + 1));
      loop.entries.emplace_back("index0", Value::integer(i));
      loop.entries.emplace_back("revindex", Value::integer(n - i));
      loop.entries.emplace_back("revindex0", Value::integer(n - i - 1));
      loop.entries.emplace_back("first", Value::boolean(i == 0));
      loop.entries.emplace_back("last", Value::boolean(i == n - 1));
      loop.entries.emplace_back("length", Value::integer(n));
      loop.entries.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("previtem"));
      loop.entries.emplace_back("nextitem",
                                i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("nextitem"));
      *index = i;
      loop.entries.emplace_back("cycle", cycle);
      assign("loop", Value::dict(std::move(loop)));
      const Value& item = items[static_cast<size_t>(i)];
      const size_t begin = out_.text.size();
      const Flow f = render(s.body);
      if (item.kind() == Value::Kind::kDict) out_.iterations.push_back({&item.entries(), begin, out_.text.size()});
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void bind(const Stmt& s, const Value& item) {
    if (s.targets.size() == 1) {
      assign(s.targets[0], item);
    } else {
      unpack(s.targets, item, s.line);
    }
  }

  Value macro(const Stmt& s) {
    const Stmt* def = &s;
    return Value::function(s.name, [this, def](Call& c) {
      if (macro_depth_ >= kMaxMacroDepth)
        fail(def->line,
             "macro `" + def->name + "` called " + std::to_string(kMaxMacroDepth) + " deep: runaway recursion?");
      ++macro_depth_;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{macro_depth_};
      Scope scope;
      for (size_t i = 0; i < def->params.size(); ++i) {
        const auto& [param, fallback] = def->params[i];
        Value v = c.arg(i, param.c_str());
        if (v.is_undefined() && fallback) v = eval(*fallback);
        scope[param] = v;
      }
      if (c.args.size() > def->params.size())
        fail(def->line, "macro `" + def->name + "` takes " + std::to_string(def->params.size()) + " arguments, given " +
                            std::to_string(c.args.size()));
      // the macro's body sees the template's top level and its parameters; its text is the result
      std::vector<Scope> saved = std::move(scopes_);
      scopes_ = {saved.front(), std::move(scope)};
      const Mark mark = this->mark();
      (void)render(def->body);
      Value result = take_since(mark);
      saved.front() = std::move(scopes_.front());
      scopes_ = std::move(saved);
      return result;
    });
  }

  static Value builtin_range() {
    return Value::function("range", [](Call& c) {
      int64_t start = 0, stop = 0, step = 1;
      auto integer = [&](const Value& v) {
        ST_CHECK(v.kind() == Value::Kind::kInt, c.where, ": range() takes integers, given a ", v.type_name());
        return v.as_int();
      };
      if (c.args.size() == 1) {
        stop = integer(c.args[0]);
      } else if (c.args.size() >= 2) {
        start = integer(c.args[0]);
        stop = integer(c.args[1]);
        if (c.args.size() > 2) step = integer(c.args[2]);
      }
      ST_CHECK(step != 0, c.where, ": range() step must not be zero");
      Value::List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
      ST_CHECK(out.size() <= 100000, c.where, ": range() of more than 100000 items");
      return Value::list(std::move(out));
    });
  }

  static Value builtin_dict(bool is_namespace) {
    return Value::function(is_namespace ? "namespace" : "dict", [is_namespace](Call& c) {
      Value::Dict d;
      d.is_namespace = is_namespace;
      for (const Value& a : c.args) {
        ST_CHECK(a.kind() == Value::Kind::kDict, c.where, ": namespace() takes keyword arguments or dicts");
        for (const auto& [k, v] : a.entries().entries) d.set(k, v);
      }
      for (const auto& [k, v] : c.kwargs) d.set(k, v);
      return Value::dict(std::move(d));
    });
  }

  // ---------------------------------------------------------------------------- expressions

  // Every value an expression makes is charged to the render's budget: strings are copied by
  // value, so this bounds the bytes a template may make the renderer build, with loops that
  // grow a string or copy a long one again and again.
  Value eval(const Expr& e) {
    Value v;
    try {
      v = evaluate(e);
    } catch (const StringLimit& limit) {
      fail(e.line, limit.what());
    }
    if (v.is_string()) built_ += v.str().size();
    else if (v.kind() == Value::Kind::kList) built_ += sizeof(Value) * v.items().size();
    if (built_ > kMaxBuilt) fail(e.line, "expressions built more than " + std::to_string(kMaxBuilt) + " bytes");
    return v;
  }

  Value evaluate(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name, e.line);
      case ExprKind::kAttr: return attribute(eval(*e.args[0]), e.name, e.line, describe(*e.args[0]));
      case ExprKind::kItem: return item(eval(*e.args[0]), eval(*e.args[1]), e.line, describe(*e.args[0]));
      case ExprKind::kSlice: return slice(e);
      case ExprKind::kCall: {
        const Value f = eval(*e.args[0]);
        if (f.kind() != Value::Kind::kFunction)
          fail(e.line, "`" + describe(*e.args[0]) + "` is " + (f.is_undefined() ? "undefined" : "a " + f.type_name()) +
                           ", not something to call");
        Call c = arguments(e, 1);
        return f.fn()(c);
      }
      case ExprKind::kFilter: {
        Call c = arguments(e, 1);
        return filter(e.name, eval(*e.args[0]), c, e.line);
      }
      case ExprKind::kTest: {
        Call c = arguments(e, 1);
        const bool r = test(e.name, eval(*e.args[0]), c, e.line);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::kUnary: {
        const Value v = eval(*e.args[0]);
        if (!v.is_number() && v.kind() != Value::Kind::kBool)
          fail(e.line, "unary " + e.name + " of a " + v.type_name());
        if (e.name == "+") return v;
        if (v.kind() == Value::Kind::kFloat) return Value::number(-v.as_double());
        return Value::integer(-(v.kind() == Value::Kind::kBool ? v.as_bool() : v.as_int()));
      }
      case ExprKind::kBinary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case ExprKind::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          if (!compare(e.ops[i], left, right, e.line)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kAnd: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? eval(*e.args[1]) : a;
      }
      case ExprKind::kOr: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? a : eval(*e.args[1]);
      }
      case ExprKind::kNot: return Value::boolean(!eval(*e.args[0]).truthy());
      case ExprKind::kCond:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined();
      case ExprKind::kList:
      case ExprKind::kTuple: {
        Value::List items;
        for (const ExprPtr& a : e.args) items.push_back(eval(*a));
        return e.kind == ExprKind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case ExprKind::kDict: {
        Value::Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(e.line, "dict keys must be strings here, found a " + k.type_name());
          d.set(k.str(), eval(*e.args[i + 1]));
        }
        return Value::dict(std::move(d));
      }
    }
    return Value();
  }

  // A short description of an expression for messages: its name or the name it reads from.
  static std::string describe(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kName: return e.name;
      case ExprKind::kAttr: return describe(*e.args[0]) + "." + e.name;
      case ExprKind::kItem: return describe(*e.args[0]) + "[...]";
      case ExprKind::kCall: return describe(*e.args[0]) + "(...)";
      default: return "expression";
    }
  }

  Call arguments(const Expr& e, size_t first) {
    Call c;
    c.where = where(e.line);
    for (size_t i = first; i < e.args.size(); ++i) c.args.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) c.kwargs.emplace_back(k, eval(*v));
    return c;
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    auto part = [&](int i) -> std::optional<int64_t> {
      if (!e.args[static_cast<size_t>(i)]) return std::nullopt;
      const Value v = eval(*e.args[static_cast<size_t>(i)]);
      if (v.is_none()) return std::nullopt;
      if (v.kind() != Value::Kind::kInt) fail(e.line, "slice indices must be integers, found a " + v.type_name());
      return v.as_int();
    };
    const std::optional<int64_t> start = part(1), stop = part(2), step_part = part(3);
    const int64_t step = step_part.value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    std::vector<size_t> cp;
    int64_t n = 0;
    if (obj.kind() == Value::Kind::kList) {
      n = static_cast<int64_t>(obj.items().size());
    } else if (obj.is_string()) {
      cp = code_points(obj.str());
      n = static_cast<int64_t>(cp.size()) - 1;
    } else {
      fail(e.line, "cannot slice a " + obj.type_name());
    }
    // Python's slice.indices
    auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t a = clamp(start, step > 0 ? 0 : n - 1), b = clamp(stop, step > 0 ? n : -1);
    std::vector<int64_t> picked;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) picked.push_back(i);
    if (obj.kind() == Value::Kind::kList) {
      Value::List out;
      for (int64_t i : picked) out.push_back(obj.items()[static_cast<size_t>(i)]);
      return Value::list(std::move(out));
    }
    if (step == 1) return picked.empty() ? Value::string("") : substring(obj, cp[a], cp[b]);
    StringBuilder out;
    for (int64_t i : picked) out.append(substring(obj, cp[static_cast<size_t>(i)], cp[static_cast<size_t>(i) + 1]));
    return out.take();
  }

  // Where the output stood before a macro body or a block `set` rendered: that text becomes a
  // string value (its provenance segments shifted along) and leaves the output. Loop iterations
  // and generation blocks inside it leave too: they described bytes that are no longer there.
  struct Mark {
    size_t text = 0, segments = 0, iterations = 0, generation = 0;
  };
  Mark mark() const { return {out_.text.size(), out_.segments.size(), out_.iterations.size(), out_.generation.size()}; }
  Value take_since(const Mark& m) {
    std::vector<Segment> segments;
    for (size_t i = m.segments; i < out_.segments.size(); ++i)
      segments.push_back({out_.segments[i].begin - m.text, out_.segments[i].end - m.text, out_.segments[i].tag});
    Value v = Value::string(out_.text.substr(m.text), std::move(segments));
    out_.text.resize(m.text);
    out_.segments.resize(m.segments);
    out_.iterations.resize(m.iterations);
    out_.generation.resize(m.generation);
    return v;
  }

  // A template is outside input: bounds on what it may make a render do.
  static constexpr int kMaxMacroDepth = 64;
  static constexpr int64_t kMaxIterations = 1'000'000;
  static constexpr size_t kMaxBuilt = size_t{1} << 30;
  const size_t max_output_;
  int64_t iterations_ = 0;
  size_t built_ = 0;
  const Value& context_;
  int macro_depth_ = 0;
  std::vector<Scope> scopes_;
  Rendered out_;
};

}  // namespace

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->body = parse_template(source, impl_->name);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Rendered Template::render(const Value& context, size_t max_output) const {
  return Renderer(impl_->name, context, max_output).run(impl_->body);
}

}  // namespace shardtrain::data::jinja
