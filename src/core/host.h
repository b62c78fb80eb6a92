// Facts about the machine this process runs on.
#pragma once

#include <string>

namespace shardtrain {

// This machine's host name, as gethostname(2) gives it; "host" when it cannot be read. For
// names of files that processes on several machines write side by side.
std::string host_name();

}  // namespace shardtrain
