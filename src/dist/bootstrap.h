// How a rank learns who it is and finds the others without MPI: a torchrun-style environment
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm's (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR/MASTER_PORT), and a small TCP exchange in
// which rank 0 hands every rank the same bytes (NCCL's unique id). Every wait has a deadline
// and fails with the address and the timeout instead of hanging.
#pragma once

#include <optional>
#include <string>

namespace shardtrain::dist {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // host name or address of rank 0
  int master_port = 0;      // where rank 0 listens for the exchange
  std::string launcher;     // "torchrun" or "slurm": which variables were read
  // Shared by every rank of one launch; rank 0 drops a connection without it. From
  // TORCHELASTIC_RUN_ID, else SLURM_JOB_ID (with SLURM_STEP_ID), else SHARDTRAIN_JOB_TOKEN;
  // empty means MASTER_ADDR:MASTER_PORT, which still rejects traffic that is not shardtrain's.
  std::string job_token;
};

// The launch described by the environment, or nullopt when neither RANK/WORLD_SIZE nor
// SLURM_PROCID/SLURM_NTASKS is set. Bad values (rank outside [0, world), a missing
// MASTER_ADDR with more than one rank, a port outside 1..65535) throw, naming the variable.
// Under torchrun's own agent store (TORCHELASTIC_USE_AGENT_STORE=True) MASTER_PORT is taken
// by that store, so the exchange uses MASTER_PORT + 1.
std::optional<LaunchEnv> launch_from_env();

// How many ranks of this launch run on this machine, as the launcher says: torchrun's
// LOCAL_WORLD_SIZE, OpenMPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS, Slurm's
// SLURM_NTASKS_PER_NODE or the first count of SLURM_TASKS_PER_NODE ("8(x2)", "4,2"); 0 when
// none is set. A value that is not a positive count throws, naming the variable.
int local_ranks_from_env();

// Where rank 0 listens: the address MASTER_ADDR names when it is an address of this host, so
// the exchange is offered only on the network the ranks use; every interface when it is not
// (a NAT or service address, a name that does not resolve), or when it is a host name that
// resolves to loopback here (Debian's 127.0.1.1 for the host's own name) while ranks may run on
// other machines (`local_ranks` < world size; 0: unknown). A literal loopback address or
// `localhost` listens on loopback. `why` says the choice for the log.
struct ListenPlan {
  bool any_interface = true;
  std::string address;  // numeric, when not any_interface
  std::string why;
};
ListenPlan plan_listen(const LaunchEnv& env, int local_ranks);

// Rank 0 listens on master_port (where plan_listen says) and sends `payload` to each of the other ranks; they connect
// to master_addr:master_port (retrying until the deadline) and receive it. Returns the
// payload on every rank. Rank 0 returns once all world_size - 1 ranks have received it.
std::string share_from_rank0(const LaunchEnv& env, const std::string& payload, double timeout_s);

}  // namespace shardtrain::dist
