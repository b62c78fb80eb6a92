// The torchrun-style environment and the TCP exchange of NCCL's unique id: every rank gets
// rank 0's bytes; a missing rank 0 or a missing rank fails at the deadline with the address.
#include "dist/bootstrap.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "testing/free_port.h"

namespace shardtrain::dist {
namespace {

using testing::free_port;

LaunchEnv rank_env(int rank, int world, int port) {
  LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.launcher = "torchrun";
  return e;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* v : kVars) unsetenv(v);
  }
  ~EnvGuard() {
    for (const char* v : kVars) unsetenv(v);
  }

 private:
  static constexpr const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                          "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                                          "SLURM_TASKS_PER_NODE"};
};

TEST(LaunchEnv, ReadsTorchrunAndSlurmVariables) {
  EnvGuard guard;
  EXPECT_FALSE(launch_from_env().has_value());
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29600", 1);
  std::optional<LaunchEnv> e = launch_from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->master_addr, "node7");
  EXPECT_EQ(e->master_port, 29600);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);  // torchrun's store holds MASTER_PORT
  EXPECT_EQ(launch_from_env()->master_port, 29601);
  unsetenv("TORCHELASTIC_USE_AGENT_STORE");

  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_LOCALID", "1", 1);
  e = launch_from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "slurm");
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->local_rank, 1);
}

TEST(LaunchEnv, RanksOnThisMachineFromEachLauncher) {
  EnvGuard guard;
  EXPECT_EQ(local_ranks_from_env(), 0) << "no launcher says";
  setenv("SLURM_TASKS_PER_NODE", "8(x2),4", 1);
  EXPECT_EQ(local_ranks_from_env(), 8);
  setenv("SLURM_TASKS_PER_NODE", "3", 1);
  EXPECT_EQ(local_ranks_from_env(), 3);
  setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  EXPECT_EQ(local_ranks_from_env(), 4);
  setenv("MPI_LOCALNRANKS", "5", 1);
  EXPECT_EQ(local_ranks_from_env(), 5);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "6", 1);
  EXPECT_EQ(local_ranks_from_env(), 6);
  setenv("LOCAL_WORLD_SIZE", "7", 1);
  EXPECT_EQ(local_ranks_from_env(), 7) << "torchrun's first";
  setenv("LOCAL_WORLD_SIZE", "0", 1);
  EXPECT_NE(error_of([] { local_ranks_from_env(); }).find("LOCAL_WORLD_SIZE = `0`"), std::string::npos);
  unsetenv("LOCAL_WORLD_SIZE");
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("MPI_LOCALNRANKS");
  unsetenv("SLURM_NTASKS_PER_NODE");
  setenv("SLURM_TASKS_PER_NODE", "(x2)", 1);
  EXPECT_NE(error_of([] { local_ranks_from_env(); }).find("SLURM_TASKS_PER_NODE = ``"), std::string::npos);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  EnvGuard guard;
  setenv("RANK", "4", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "localhost", 1);
  EXPECT_NE(error_of([] { launch_from_env(); }).find("RANK = `4`"), std::string::npos);
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "http", 1);
  EXPECT_NE(error_of([] { launch_from_env(); }).find("MASTER_PORT = `http`"), std::string::npos);
  unsetenv("MASTER_PORT");
  unsetenv("MASTER_ADDR");
  EXPECT_NE(error_of([] { launch_from_env(); }).find("MASTER_ADDR is not set"), std::string::npos);
  unsetenv("WORLD_SIZE");
  EXPECT_NE(error_of([] { launch_from_env(); }).find("RANK and WORLD_SIZE"), std::string::npos);
}

TEST(Bootstrap, EveryRankReceivesRankZerosBytes) {
  const int port = free_port(), world = 4;
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);  // binary, with zeros
  std::vector<std::future<std::string>> ranks;
  // the others start first: they must keep retrying until rank 0 listens
  for (int r = 1; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, [=] { return share_from_rank0(rank_env(r, world, port), "", 20); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(share_from_rank0(rank_env(0, world, port), id, 20), id);
  for (auto& f : ranks) EXPECT_EQ(f.get(), id);
}

TEST(Bootstrap, UnreachableRankZeroFailsWithAddressAndTimeout) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { share_from_rank0(rank_env(1, 2, port), "", 0.5); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("could not reach rank 0 at 127.0.0.1:" + std::to_string(port) + " within 0.5 s"),
            std::string::npos)
      << msg;
  EXPECT_LT(waited, 5.0);
}

TEST(Bootstrap, RankZeroNamesTheRanksThatNeverCame) {
  const int port = free_port();
  auto one = std::async(std::launch::async, [=] { return share_from_rank0(rank_env(1, 3, port), "", 10); });
  const std::string msg = error_of([&] { share_from_rank0(rank_env(0, 3, port), "abc", 1.0); });
  EXPECT_NE(msg.find("1 of 2 ranks connected; missing rank(s) 2"), std::string::npos) << msg;
  EXPECT_EQ(one.get(), "abc");
}

// Connects to rank 0 on loopback (retrying while it starts), sends `bytes` and closes.
void send_raw(int port, const std::string& bytes) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      if (!bytes.empty()) {
        EXPECT_EQ(::send(s, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ::close(s);
      return;
    }
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "rank 0 never listened on port " << port;
}

// A greeting of this build: magic, version 2, rank, token length, token.
std::string greeting(int rank, const std::string& token) {
  std::string g = "STBP";
  for (uint32_t v : {2u, static_cast<uint32_t>(rank), static_cast<uint32_t>(token.size())})
    for (int i = 0; i < 4; ++i) g.push_back(static_cast<char>(v >> (8 * i)));
  return g + token;
}

// Strays (garbage, silence, another job's token) are dropped and the real ranks still connect.
TEST(Bootstrap, StrayConnectionsAreDroppedAndTheRanksStillConnect_Garbage_Silent_WrongToken) {
  const int port = free_port(), world = 3;
  auto zero = std::async(std::launch::async, [=] { return share_from_rank0(rank_env(0, world, port), "id", 20); });
  send_raw(port, "GET / HTTP/1.0\r\n\r\n");
  send_raw(port, "");
  send_raw(port, greeting(1, "shardtrain:another job"));
  send_raw(port, "STB");  // a short read
  std::vector<std::future<std::string>> ranks;
  for (int r = 1; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, [=] { return share_from_rank0(rank_env(r, world, port), "", 20); }));
  for (auto& f : ranks) EXPECT_EQ(f.get(), "id");
  EXPECT_EQ(zero.get(), "id");
}

// A connection that sends nothing and stays open is dropped at the greeting's timeout, not
// the launch's.
TEST(Bootstrap, ASilentOpenConnectionDoesNotHoldTheLaunch) {
  const int port = free_port();
  auto zero = std::async(std::launch::async, [=] { return share_from_rank0(rank_env(0, 2, port), "id", 20); });
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  for (int i = 0; i < 100 && ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(share_from_rank0(rank_env(1, 2, port), "", 20), "id");
  EXPECT_EQ(zero.get(), "id");
  ::close(s);
}

// With the job's token, a rank outside the world still ends the launch with a clear error.
TEST(Bootstrap, WithTheRightTokenARankOutOfRangeIsAnError) {
  const int port = free_port();
  auto zero = std::async(std::launch::async, [=] {
    return error_of([&] { share_from_rank0(rank_env(0, 2, port), "id", 10); });
  });
  send_raw(port, greeting(7, "addr:127.0.0.1:" + std::to_string(port)));
  const std::string msg = zero.get();
  EXPECT_NE(msg.find("a process connected as rank 7 but WORLD_SIZE is 2"), std::string::npos) << msg;
}

// A rank of an older build (its greeting "STB1" and a rank) is told apart from a stray: the
// launch ends naming the versions instead of waiting for a rank that will never greet.
TEST(Bootstrap, AnOlderBuildsGreetingIsAClearError) {
  const int port = free_port();
  auto zero = std::async(std::launch::async, [=] {
    return error_of([&] { share_from_rank0(rank_env(0, 2, port), "id", 10); });
  });
  send_raw(port, std::string("STB1\x01\0\0\0", 8));
  const std::string msg = zero.get();
  EXPECT_NE(msg.find("speaks bootstrap protocol version 1 but this build speaks version 2"), std::string::npos) << msg;
}

// The launcher's run id is the token; SHARDTRAIN_JOB_TOKEN when no launcher gives one.
TEST(LaunchEnv, TheJobTokenComesFromTheLaunchersRunId) {
  EnvGuard guard;
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_EQ(launch_from_env()->job_token, "");
  setenv("SHARDTRAIN_JOB_TOKEN", "mine", 1);
  EXPECT_EQ(launch_from_env()->job_token, "shardtrain:mine");
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  EXPECT_EQ(launch_from_env()->job_token, "slurm:77.3");
  setenv("TORCHELASTIC_RUN_ID", "abc", 1);
  EXPECT_EQ(launch_from_env()->job_token, "torchelastic:abc");
  for (const char* v : {"SHARDTRAIN_JOB_TOKEN", "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"}) unsetenv(v);
}

}  // namespace
}  // namespace shardtrain::dist
