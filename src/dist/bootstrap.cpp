// The TCP exchange of bootstrap.h. Frames (integers 4 bytes, little endian): a client sends
// "STBP", the protocol version, its rank, the job token's length and the token; rank 0 answers
// with the payload's length and the payload. A greeting without the job's token is dropped.
#include "dist/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace shardtrain::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'S', 'T', 'B', 'P'};
constexpr uint32_t kProtocolVersion = 2;
constexpr uint32_t kMaxPayload = 1 << 20;
constexpr uint32_t kMaxToken = 1024;
constexpr double kGreetingTimeoutS = 2.0;  // a connection that does not greet by then is not one of ours

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& value, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value.c_str(), &end, 10);
  ST_CHECK(errno == 0 && end != value.c_str() && *end == '\0' && v >= lo && v <= hi, "environment variable ", name,
           " = `", value, "`: expected an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

double remaining(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const double left = remaining(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) ST_THROW("poll failed: ", std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ST_CHECK(wait_fd(fd, POLLOUT, deadline), "bootstrap: timed out sending to ", peer);
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ST_CHECK(w > 0, "bootstrap: sending to ", peer, " failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ST_CHECK(wait_fd(fd, POLLIN, deadline), "bootstrap: timed out waiting for data from ", peer);
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ST_CHECK(r > 0, "bootstrap: ", peer, r == 0 ? " closed the connection early" : " failed: ",
             r == 0 ? "" : std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

uint32_t read_u32(const unsigned char* b) {
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}
void write_u32(unsigned char* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
}

// The token every rank of one launch shares; a LaunchEnv made by hand gets rank 0's address.
std::string job_token(const LaunchEnv& e) {
  return e.job_token.empty() ? "addr:" + e.master_addr + ":" + std::to_string(e.master_port) : e.job_token;
}

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  } else if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  }
  return fmt::format("{}:{}", host, port);
}

// `text` as a numeric IPv4 or IPv6 address with `port`; false when it is not one.
bool numeric_address(const std::string& text, int port, sockaddr_storage& out, socklen_t& len) {
  out = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  if (::inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (::inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

std::string numeric_name(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  ::getnameinfo(a, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
  return host;
}

std::string serve(const LaunchEnv& e, const std::string& payload, double timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  const ListenPlan plan = plan_listen(e, local_ranks_from_env());
  log::info(fmt::format("bootstrap: rank 0 listens on {} port {}: {}", plan.any_interface ? "every interface" : plan.address,
                        e.master_port, plan.why));
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  if (plan.any_interface) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    v6->sin6_port = htons(static_cast<uint16_t>(e.master_port));
    addr_len = sizeof(sockaddr_in6);
  } else {
    ST_ASSERT(numeric_address(plan.address, e.master_port, addr, addr_len), "a numeric listen address");
  }
  Fd listener(::socket(addr.ss_family, SOCK_STREAM, 0));
  ST_CHECK(listener.get() >= 0, "bootstrap: socket() failed: ", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (plan.any_interface)
    ::setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
  ST_CHECK(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) == 0, "bootstrap: rank 0 cannot ",
           "listen on ", plan.any_interface ? std::string("port ") : plan.address + " port ", e.master_port,
           " (MASTER_PORT", e.launcher == "torchrun-agent" ? " + 1" : "", "): ", std::strerror(errno),
           "; pick a free port");
  ST_CHECK(::listen(listener.get(), 128) == 0, "bootstrap: listen() failed: ", std::strerror(errno));
  std::set<int> served;
  while (static_cast<int>(served.size()) < e.world_size - 1) {
    if (!wait_fd(listener.get(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < e.world_size; ++r)
        if (!served.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      ST_THROW("bootstrap: rank 0 waited ", timeout_s, " s on port ", e.master_port, " and ", served.size(), " of ",
               e.world_size - 1, " ranks connected; missing rank(s) ", missing,
               " (are they running, with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE?)");
    }
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    Fd c(::accept(listener.get(), reinterpret_cast<sockaddr*>(&from), &from_len));
    if (c.get() < 0) continue;
    const std::string peer = peer_name(from);
    const Clock::time_point greeting_deadline =
        std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(kGreetingTimeoutS)));
    unsigned char hello[16] = {};
    std::string token;
    try {
      // the magic and the version first: an older build's rank sends 8 bytes and waits
      recv_all(c.get(), hello, 8, greeting_deadline, peer);
      if (std::memcmp(hello, kMagic, 4) == 0 && read_u32(hello + 4) == kProtocolVersion) {
        recv_all(c.get(), hello + 8, 8, greeting_deadline, peer);
        if (read_u32(hello + 12) <= kMaxToken) {
          token.resize(read_u32(hello + 12));
          recv_all(c.get(), token.data(), token.size(), greeting_deadline, peer);
        }
      }
    } catch (const Error& err) {
      log::warn(fmt::format("bootstrap: dropped a connection from {} that did not greet as a rank of this job: {}", peer,
                            err.what()));
      continue;
    }
    ST_CHECK(std::memcmp(hello, "STB1", 4) != 0, "bootstrap: a process at ", peer, " speaks bootstrap protocol "
             "version 1 but this build speaks version ", kProtocolVersion, "; run the same shardtrain build on every "
             "rank");
    if (std::memcmp(hello, kMagic, 4) != 0) {
      log::warn(fmt::format("bootstrap: dropped a connection from {}: not a shardtrain rank (wrong greeting)", peer));
      continue;
    }
    ST_CHECK(read_u32(hello + 4) == kProtocolVersion, "bootstrap: a process at ", peer,
             " speaks bootstrap protocol version ", read_u32(hello + 4), " but this build speaks version ",
             kProtocolVersion, "; run the same shardtrain build on every rank");
    if (token != job_token(e)) {
      log::warn(fmt::format("bootstrap: dropped a connection from {}: its job token is not this job's (a rank of "
                            "another launch on the same MASTER_ADDR/MASTER_PORT?)", peer));
      continue;
    }
    const int r = static_cast<int>(read_u32(hello + 8));
    ST_CHECK(r >= 1 && r < e.world_size, "bootstrap: a process connected as rank ", r, " but WORLD_SIZE is ",
             e.world_size);
    ST_CHECK(!served.count(r), "bootstrap: two processes connected as rank ", r, "; check RANK in the launcher");
    unsigned char len[4];
    write_u32(len, static_cast<uint32_t>(payload.size()));
    send_all(c.get(), len, 4, deadline, "rank " + std::to_string(r));
    send_all(c.get(), payload.data(), payload.size(), deadline, "rank " + std::to_string(r));
    served.insert(r);
  }
  return payload;
}

std::string fetch(const LaunchEnv& e, double timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  const std::string where = e.master_addr + ":" + std::to_string(e.master_port);
  std::string last_error = "no attempt";
  while (remaining(deadline) > 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(e.master_port);
    const int gai = ::getaddrinfo(e.master_addr.c_str(), port.c_str(), &hints, &found);
    if (gai != 0) {
      last_error = std::string("cannot resolve the address: ") + ::gai_strerror(gai);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        Fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
        if (s.get() < 0) continue;
        if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
          last_error = std::strerror(errno);
          continue;
        }
        ::freeaddrinfo(found);
        found = nullptr;
        const std::string token = job_token(e);
        unsigned char hello[16];
        std::memcpy(hello, kMagic, 4);
        write_u32(hello + 4, kProtocolVersion);
        write_u32(hello + 8, static_cast<uint32_t>(e.rank));
        write_u32(hello + 12, static_cast<uint32_t>(token.size()));
        send_all(s.get(), hello, sizeof hello, deadline, "rank 0 at " + where);
        send_all(s.get(), token.data(), token.size(), deadline, "rank 0 at " + where);
        unsigned char len[4];
        recv_all(s.get(), len, 4, deadline, "rank 0 at " + where);
        const uint32_t n = read_u32(len);
        ST_CHECK(n <= kMaxPayload, "bootstrap: rank 0 at ", where, " announced ", n, " bytes; not a shardtrain rank 0?");
        std::string payload(n, '\0');
        recv_all(s.get(), payload.data(), n, deadline, "rank 0 at " + where);
        return payload;
      }
      if (found != nullptr) ::freeaddrinfo(found);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ST_THROW("bootstrap: rank ", e.rank, " could not reach rank 0 at ", where, " within ", timeout_s,
           " s (last error: ", last_error, "); check MASTER_ADDR/MASTER_PORT, that rank 0 is running, and firewalls");
}

}  // namespace

std::optional<LaunchEnv> launch_from_env() {
  LaunchEnv e;
  if (auto rank = env("RANK"), world = env("WORLD_SIZE"); rank || world) {
    ST_CHECK(rank && world, "environment: RANK and WORLD_SIZE must be set together (torchrun-style launch)");
    e.world_size = env_int("WORLD_SIZE", *world, 1, 1 << 20);
    e.rank = env_int("RANK", *rank, 0, e.world_size - 1);
    if (auto l = env("LOCAL_RANK")) e.local_rank = env_int("LOCAL_RANK", *l, 0, 1 << 20);
    e.launcher = "torchrun";
  } else if (auto srank = env("SLURM_PROCID"), sworld = env("SLURM_NTASKS"); srank && sworld) {
    e.world_size = env_int("SLURM_NTASKS", *sworld, 1, 1 << 20);
    e.rank = env_int("SLURM_PROCID", *srank, 0, e.world_size - 1);
    if (auto l = env("SLURM_LOCALID")) e.local_rank = env_int("SLURM_LOCALID", *l, 0, 1 << 20);
    e.launcher = "slurm";
  } else {
    return std::nullopt;
  }
  // the launch's own id, so that rank 0 lets in only this job's ranks
  if (auto id = env("TORCHELASTIC_RUN_ID")) e.job_token = "torchelastic:" + *id;
  else if (auto job = env("SLURM_JOB_ID")) {
    e.job_token = "slurm:" + *job;
    if (auto step = env("SLURM_STEP_ID")) e.job_token.append(".").append(*step);
  }
  else if (auto own = env("SHARDTRAIN_JOB_TOKEN")) e.job_token = "shardtrain:" + *own;
  ST_CHECK(e.job_token.size() <= kMaxToken, "environment: the job token (TORCHELASTIC_RUN_ID, SLURM_JOB_ID or "
           "SHARDTRAIN_JOB_TOKEN) has ", e.job_token.size(), " bytes with its prefix; at most ", kMaxToken,
           " are allowed");
  if (e.world_size == 1) return e;
  auto addr = env("MASTER_ADDR");
  ST_CHECK(addr.has_value(), "environment: ", e.world_size, " ranks (", e.launcher,
           "-style launch) but MASTER_ADDR is not set; set it to rank 0's host name");
  e.master_addr = *addr;
  e.master_port = env_int("MASTER_PORT", env("MASTER_PORT").value_or("29500"), 1, 65535);
  if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    ST_CHECK(e.master_port < 65535, "environment: MASTER_PORT 65535 leaves no port for the exchange");
    e.master_port += 1;
    e.launcher = "torchrun-agent";
  }
  return e;
}

int local_ranks_from_env() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (auto v = env(name)) return env_int(name, *v, 1, 1 << 20);
  if (auto v = env("SLURM_TASKS_PER_NODE")) {
    // counts per node, run-length coded: "8(x2),4"; this node's is not named, the first stands for all
    const std::string first = v->substr(0, v->find_first_of("(,"));
    return env_int("SLURM_TASKS_PER_NODE", first, 1, 1 << 20);
  }
  return 0;
}

ListenPlan plan_listen(const LaunchEnv& e, int local_ranks) {
  ListenPlan plan;
  const std::string& name = e.master_addr;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int gai = ::getaddrinfo(name.c_str(), nullptr, &hints, &found); gai != 0) {
    plan.why = fmt::format("MASTER_ADDR `{}` does not resolve here ({})", name, ::gai_strerror(gai));
    return plan;
  }
  sockaddr_storage probe{};
  socklen_t probe_len = 0;
  const bool literal = numeric_address(name, 0, probe, probe_len) || name == "localhost";
  std::string seen;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const std::string address = numeric_name(a->ai_addr, a->ai_addrlen);
    seen += (seen.empty() ? "" : ", ") + address;
    if (is_loopback(a->ai_addr) && !literal && !(local_ranks > 0 && local_ranks >= e.world_size)) {
      ::freeaddrinfo(found);
      plan.why = fmt::format("MASTER_ADDR `{}` resolves to the loopback address {} on this host, and ranks may run "
                             "on other machines (set MASTER_ADDR to the address they reach rank 0 at to listen "
                             "only there)", name, address);
      return plan;
    }
    // an address of this host accepts a bind; another one does not
    Fd s(::socket(a->ai_family, SOCK_STREAM, 0));
    if (s.get() < 0) continue;
    sockaddr_storage any_port{};
    std::memcpy(&any_port, a->ai_addr, a->ai_addrlen);
    if (any_port.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&any_port)->sin_port = 0;
    else reinterpret_cast<sockaddr_in6*>(&any_port)->sin6_port = 0;
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&any_port), a->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      plan.any_interface = false;
      plan.address = address;
      plan.why = address == name ? std::string("MASTER_ADDR") : fmt::format("MASTER_ADDR `{}`", name);
      return plan;
    }
  }
  ::freeaddrinfo(found);
  plan.why = fmt::format("MASTER_ADDR `{}` ({}) is not an address of this host (a NAT or service address?)", name, seen);
  return plan;
}

std::string share_from_rank0(const LaunchEnv& env_, const std::string& payload, double timeout_s) {
  ST_CHECK(payload.size() <= kMaxPayload, "bootstrap: payload of ", payload.size(), " bytes is too large");
  if (env_.world_size == 1) return payload;
  return env_.rank == 0 ? serve(env_, payload, timeout_s) : fetch(env_, timeout_s);
}

}  // namespace shardtrain::dist
