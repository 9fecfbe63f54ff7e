// The peers' recipes: gloo_peer (Gloo's own collectives over its TCP transport, meeting at a store
// of ours), mpi_peer under mpirun (OpenMPI's defaults, or TCP only as "mpi-tcp") and torch_peer.py
// (torch.distributed's gloo backend, meeting at torch's own store).
#include "tools/dtrain/bench_peers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "launch/spawn.h"

namespace dtrain::tools {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// gloo: N gloo_peer ranks meeting at a store the driver hosts.

fs::path gloo_exe(const PeerSetup& s) { return s.bin_dir / "gloo_peer"; }

std::optional<std::string> gloo_missing(const PeerSetup& s) {
  if (!fs::exists(gloo_exe(s)))
    return fmt::format("{} not built (install libgloo-dev and rebuild)", gloo_exe(s).string());
  return std::nullopt;
}

PeerRun gloo_start(const PeerSetup& s) {
  PeerRun run;
  TcpStoreServerOptions so;
  so.host = s.cluster ? s.cluster->head() : "127.0.0.1";
  so.port = 0;
  run.store = std::make_unique<TcpStoreServer>(so);
  for (int r = 0; r < s.np; ++r) {
    ChildSpec c{
        fmt::format("rank {}", r), {gloo_exe(s).string()}, rank_env(r, s.np, run.store->port())};
    if (s.cluster) place(c, *s.cluster, r, s.np, s.cluster->head());
    c.argv.insert(c.argv.end(), s.peer_args.begin(), s.peer_args.end());
    run.children.push_back(std::move(c));
  }
  return run;
}

// ---------------------------------------------------------------------------------------------
// mpi, mpi-tcp: one mpirun, which starts the N mpi_peer ranks itself.

fs::path mpi_exe(const PeerSetup& s) { return s.bin_dir / "mpi_peer"; }

// mpirun reaches an emulated cluster's hosts through this script's remote shell.
fs::path netns_script() {
  return fs::path(DTRAIN_BENCH_PEERS_DIR).parent_path().parent_path() / "scripts" /
         "netns-hosts.sh";
}

std::optional<std::string> mpi_missing(const PeerSetup& s) {
  if (!fs::exists(mpi_exe(s)))
    return fmt::format("{} not built (install libopenmpi-dev and rebuild)", mpi_exe(s).string());
  try {
    launch::find_executable("mpirun");
  } catch (const Error&) {
    return "mpirun not found on PATH (install openmpi-bin)";
  }
  if (s.cluster && !fs::exists(netns_script()))
    return fmt::format("{} not found (mpirun reaches the hosts through it)",
                       netns_script().string());
  return std::nullopt;
}

// mpirun stays here and starts its daemons on the hosts through the script's remote shell
// (ip netns exec); they and the ranks talk over the cluster's subnet.
std::vector<std::string> mpirun_cluster_args(const EmulatedCluster& cluster, int np) {
  std::vector<std::string> args;
  std::string hosts;
  for (int h = 0; h < std::min(cluster.hosts, np); ++h)
    hosts += fmt::format("{}{}:{}", hosts.empty() ? "" : ",", cluster.address(h),
                         cluster.ranks_on(h, np));
  const std::string net = cluster.subnet + ".0/24";
  // Every daemon would bind its first rank to core 0, and none sees that the "hosts" share
  // this machine's cores: without binding, and yielding when idle where the ranks outnumber
  // the cores (what mpirun does by itself for an oversubscribed single host).
  if (np > static_cast<int>(std::thread::hardware_concurrency()))
    args.insert(args.end(), {"--mca", "mpi_yield_when_idle", "1"});
  // A daemon shares its hardware topology with its ranks through a segment it maps at a
  // hole in its address space, and OpenMPI 4.1's hwloc crashes there now and then when
  // several daemons start on one machine: no sharing.
  args.insert(args.end(), {"--mca", "rtc_hwloc_vmhole", "none"});
  args.insert(args.end(), {"--bind-to", "none", "--host", hosts, "--mca", "plm_rsh_agent",
                           netns_script().string() + " rsh " + cluster.name, "--mca",
                           "btl_tcp_if_include", net, "--mca", "oob_tcp_if_include", net});
  return args;
}

PeerRun mpi_start(const PeerSetup& s) {
  ChildSpec c;
  c.label = "mpirun";
  c.argv = {launch::find_executable("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np",
            std::to_string(s.np)};
  if (s.name == "mpi-tcp")
    c.argv.insert(c.argv.end(), {"--mca", "btl", "tcp,self", "--mca", "pml", "ob1"});
  if (s.cluster) {
    const std::vector<std::string> more = mpirun_cluster_args(*s.cluster, s.np);
    c.argv.insert(c.argv.end(), more.begin(), more.end());
  }
  c.argv.insert(c.argv.end(), {mpi_exe(s).string(), "--impl", s.name});
  c.argv.insert(c.argv.end(), s.peer_args.begin(), s.peer_args.end());
  PeerRun run;
  run.children.push_back(std::move(c));
  return run;
}

// ---------------------------------------------------------------------------------------------
// torch: N torch_peer.py ranks meeting at torch's own store, which rank 0 hosts.

// The interpreter of the environment dtrain was built for (it holds torch), else the python3
// first on PATH; "" when there is none (why_no_python says why).
std::string torch_python() {
#ifdef DTRAIN_PYTHON_EXECUTABLE
  return fs::exists(DTRAIN_PYTHON_EXECUTABLE) ? DTRAIN_PYTHON_EXECUTABLE : "";
#else
  try {
    return launch::find_executable("python3");
  } catch (const Error&) {
    return "";
  }
#endif
}

std::string why_no_python() {
#ifdef DTRAIN_PYTHON_EXECUTABLE
  return fmt::format("{} not found (install python3)", DTRAIN_PYTHON_EXECUTABLE);
#else
  return "python3 not found on PATH (install python3)";
#endif
}

fs::path torch_script() { return fs::path(DTRAIN_BENCH_PEERS_DIR) / "torch_peer.py"; }

std::optional<std::string> torch_missing(const PeerSetup&) {
  if (torch_python().empty()) return why_no_python();
  if (!fs::exists(torch_script())) return fmt::format("{} not found", torch_script().string());
  return std::nullopt;
}

// Importing torch takes seconds; ask once, bounded, before starting N of them.
std::optional<PeerProbe> torch_probe(const PeerSetup&) {
  const std::string python = torch_python();
  return PeerProbe{
      ChildSpec{"import check", {python, "-c", "import torch.distributed"}, {}}, 120.0,
      fmt::format("{} cannot import torch.distributed (install torch into that environment, "
                  "e.g. with scripts/install-deps.sh)",
                  python)};
}

// A TCP port free right now on 127.0.0.1 (for torch's own store; the tiny race with another
// process taking it meanwhile shows up as that peer failing, named).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw InternalError(fmt::format("dtrain bench: socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw InternalError(
        fmt::format("dtrain bench: cannot find a free port: {}", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

PeerRun torch_start(const PeerSetup& s) {
  const std::string python = torch_python();
  const uint16_t port = free_port();
  PeerRun run;
  for (int r = 0; r < s.np; ++r) {
    auto env = rank_env(r, s.np, port);
    env.emplace_back("OMP_NUM_THREADS", "1");
    // torch's gloo finds its address from the host name, which inside a namespace names
    // nothing reachable: the namespace's one interface instead.
    if (s.cluster) env.emplace_back("GLOO_SOCKET_IFNAME", "eth0");
    ChildSpec c{fmt::format("rank {}", r), {python, torch_script().string()}, env};
    if (s.cluster) place(c, *s.cluster, r, s.np, s.cluster->address(0));
    c.argv.insert(c.argv.end(), s.peer_args.begin(), s.peer_args.end());
    run.children.push_back(std::move(c));
  }
  return run;
}

// ---------------------------------------------------------------------------------------------
// The table, in the order --help lists the peers; "mpi" and "mpi-tcp" share one recipe, which
// reads the name it runs as.

constexpr PeerRecipe kPeers[] = {
    {"gloo", gloo_missing, nullptr, gloo_start},
    {"mpi", mpi_missing, nullptr, mpi_start},
    {"mpi-tcp", mpi_missing, nullptr, mpi_start},
    {"torch", torch_missing, torch_probe, torch_start},
};

}  // namespace

std::span<const PeerRecipe> peer_recipes() { return kPeers; }

const PeerRecipe* find_peer(std::string_view name) {
  for (const PeerRecipe& p : kPeers)
    if (p.name == name) return &p;
  return nullptr;
}

std::string peer_names(std::string_view last_separator) {
  std::string text;
  const std::span<const PeerRecipe> peers = peer_recipes();
  for (size_t i = 0; i < peers.size(); ++i) {
    if (i > 0) text += i + 1 == peers.size() ? last_separator : std::string_view(", ");
    text += peers[i].name;
  }
  return text;
}

}  // namespace dtrain::tools
