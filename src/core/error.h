// The one error type of shardtrain and the checking macros. An Error carries a chain of
// context lines, innermost first, added while unwinding; cli/ prints the chain once.
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace shardtrain {

class Error : public std::exception {
 public:
  explicit Error(std::string message) : message_(std::move(message)) { rebuild(); }

  // Adds an outer context line ("while loading checkpoint `ckpt/step_100`").
  void add_context(std::string context) {
    context_.push_back(std::move(context));
    rebuild();
  }
  const std::string& message() const { return message_; }
  const std::vector<std::string>& context() const { return context_; }
  const char* what() const noexcept override { return full_.c_str(); }

 private:
  void rebuild();

  std::string message_;
  std::vector<std::string> context_;  // innermost first
  std::string full_;
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_assert(const char* file, int line, const char* expression,
                               const std::string& message);

}  // namespace detail

// Runs `body`; if it throws an Error, adds `context` (built only on failure) and rethrows.
template <typename Body, typename Context>
decltype(auto) with_context(Context&& context, Body&& body) {
  try {
    return body();
  } catch (Error& e) {
    e.add_context(context());
    throw;
  }
}

}  // namespace shardtrain

// Bad input or config: the message names what was expected and what was found.
// Arguments are streamed together: ST_CHECK(n > 0, "key `model.dim`: expected > 0, found ", n).
#define ST_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ::shardtrain::detail::throw_error(__FILE__, __LINE__,                                  \
                                        ::shardtrain::detail::concat(__VA_ARGS__));          \
    }                                                                                        \
  } while (0)

// Our own invariants: failing one is a shardtrain bug, reported with the expression.
#define ST_ASSERT(cond, ...)                                                                 \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ::shardtrain::detail::throw_assert(__FILE__, __LINE__, #cond,                          \
                                         ::shardtrain::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                        \
  } while (0)

#define ST_THROW(...) \
  ::shardtrain::detail::throw_error(__FILE__, __LINE__, ::shardtrain::detail::concat(__VA_ARGS__))
