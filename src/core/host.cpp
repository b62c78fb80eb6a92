// Facts about the machine this process runs on.
#include "core/host.h"

#include <unistd.h>

namespace shardtrain {

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "host";
  return buffer;
}

}  // namespace shardtrain
