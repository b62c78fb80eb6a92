// Error formatting: the message first, then each context line outward.
#include "core/error.h"

namespace shardtrain {

void Error::rebuild() {
  full_ = message_;
  for (const std::string& c : context_) {
    full_ += "\n  while ";
    full_ += c;
  }
}

namespace detail {

void throw_error(const char* file, int line, const std::string& message) {
  (void)file;
  (void)line;
  throw Error(message);
}

void throw_assert(const char* file, int line, const char* expression, const std::string& message) {
  throw Error(concat("internal error (shardtrain bug) at ", file, ":", line, ": `", expression,
                     "` failed", message.empty() ? "" : ": ", message));
}

}  // namespace detail
}  // namespace shardtrain
