// Facts about the machine this process runs on.
#include "core/host.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace shardtrain {

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "host";
  return buffer;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return machine_cpus();
  return std::max(1, CPU_COUNT(&set));
}

int machine_cpus() { return std::max(1, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))); }

int host_threads_per_rank(int affinity, int machine, int local_ranks) {
  if (affinity < machine) return std::max(1, affinity);  // the launcher gave this rank its CPUs
  return std::max(1, machine / std::max(1, local_ranks));
}

}  // namespace shardtrain
