// Facts about the machine this process runs on.
#pragma once

#include <string>

namespace shardtrain {

// This machine's host name, as gethostname(2) gives it; "host" when it cannot be read. For
// names of files that processes on several machines write side by side.
std::string host_name();

// The CPUs this process may run on (its affinity mask, which a launcher's binding narrows)
// and the machine's online CPUs.
int affinity_cpus();
int machine_cpus();

// Threads for one rank's host work when `local_ranks` ranks share this machine (0: unknown,
// taken as 1): a process bound to fewer CPUs than the machine has (srun --cpus-per-task,
// mpirun --bind-to) takes all of its own; an unbound one its share of the machine's. At least 1.
int host_threads_per_rank(int affinity, int machine, int local_ranks);

}  // namespace shardtrain
