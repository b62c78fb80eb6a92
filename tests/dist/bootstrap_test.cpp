// The torchrun-style environment and the TCP exchange of NCCL's unique id: every rank gets
// rank 0's bytes; a missing rank 0 or a missing rank fails at the deadline with the address.
#include "dist/bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
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

namespace shardtrain::dist {
namespace {

// A non-loopback IPv4 address of this host, or "" when it has none.
std::string non_loopback_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string found;
  for (ifaddrs* i = all; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(v4->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(all);
  return found;
}

bool connects(const std::string& address, int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// Rank 0 listens where MASTER_ADDR points when that is an address of this host, and on every
// interface when it is not (or does not resolve), saying why.
TEST(Bootstrap, RankZeroListensOnMasterAddrsInterface) {
  LaunchEnv e = rank_env(0, 2, 0);
  ListenPlan p = plan_listen(e, 0);
  EXPECT_FALSE(p.any_interface);
  EXPECT_EQ(p.address, "127.0.0.1");
  e.master_addr = "localhost";
  p = plan_listen(e, 0);
  EXPECT_FALSE(p.any_interface) << p.why;
  EXPECT_TRUE(p.address == "127.0.0.1" || p.address == "::1") << p.address;
  e.master_addr = "192.0.2.1";  // TEST-NET-1: never an address of this host
  p = plan_listen(e, 0);
  EXPECT_TRUE(p.any_interface);
  EXPECT_NE(p.why.find("MASTER_ADDR `192.0.2.1` (192.0.2.1) is not an address of this host"), std::string::npos)
      << p.why;
  e.master_addr = "no-such-host.invalid";
  p = plan_listen(e, 0);
  EXPECT_TRUE(p.any_interface);
  EXPECT_NE(p.why.find("does not resolve here"), std::string::npos) << p.why;
  const std::string own = non_loopback_address();
  if (!own.empty()) {
    e.master_addr = own;
    p = plan_listen(e, 0);
    EXPECT_FALSE(p.any_interface) << p.why;
    EXPECT_EQ(p.address, own);
  }
}

// With MASTER_ADDR on loopback, the exchange is not offered on the host's other addresses.
TEST(Bootstrap, ALoopbackListenerIsNotReachableFromOtherInterfaces) {
  const std::string own = non_loopback_address();
  if (own.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address to try";
  const int port = free_port();
  auto zero = std::async(std::launch::async, [=] { return share_from_rank0(rank_env(0, 2, port), "id", 20); });
  bool listening = false;
  for (int i = 0; i < 200 && !listening; ++i) {
    listening = connects("127.0.0.1", port);  // a silent connection rank 0 drops
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(listening);
  EXPECT_FALSE(connects(own, port)) << own;
  EXPECT_EQ(share_from_rank0(rank_env(1, 2, port), "", 20), "id");
  EXPECT_EQ(zero.get(), "id");
}

// A host name that resolves to loopback here (as Debian maps the host's own name) listens on
// every interface unless the launcher says all ranks are on this machine.
TEST(Bootstrap, AHostNameOnLoopbackListensEverywhereUnlessAllRanksAreLocal) {
  LaunchEnv e = rank_env(0, 4, 0);
  e.master_addr = "ip6-localhost";
  addrinfo* found = nullptr;
  if (::getaddrinfo(e.master_addr.c_str(), nullptr, nullptr, &found) != 0) GTEST_SKIP() << "no ip6-localhost here";
  ::freeaddrinfo(found);
  ListenPlan p = plan_listen(e, 0);
  EXPECT_TRUE(p.any_interface);
  EXPECT_NE(p.why.find("resolves to the loopback address"), std::string::npos) << p.why;
  p = plan_listen(e, 2);
  EXPECT_TRUE(p.any_interface);
  p = plan_listen(e, 4);
  const int s6 = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 lo{};
  lo.sin6_family = AF_INET6;
  lo.sin6_addr = in6addr_loopback;
  const bool has_ipv6_loopback = s6 >= 0 && ::bind(s6, reinterpret_cast<sockaddr*>(&lo), sizeof lo) == 0;
  if (s6 >= 0) ::close(s6);
  if (has_ipv6_loopback) {
    EXPECT_FALSE(p.any_interface) << p.why;
  }
}

}  // namespace
}  // namespace shardtrain::dist
