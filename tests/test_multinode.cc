// test_multinode.cc — multi-node sessions as real processes on 127.0.0.1: an
// in-process orchestrator, and one ruccl-test-node process per node (tests/node_main.c).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <cstring>
#include <regex>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

extern "C" {
#include "net/wire.h"
#include "ruccl.h"
#include "transport.h"
}

extern char **environ;

namespace {

const char kSecret[] = "multinode-secret";
const uint16_t kNodeHello = 20;  // the first frame of a link between nodes (links.c)

struct Orchestrator {
  ruccl_orchestrator_t *o = nullptr;
  std::string host;
  explicit Orchestrator(std::string listen_host = "127.0.0.1") : host(std::move(listen_host)) {
    EXPECT_EQ(RUCCL_OK, ruccl_orchestrator_start((host + ":0").c_str(), kSecret, strlen(kSecret), &o))
        << ruccl_last_error();
  }
  ~Orchestrator() { ruccl_orchestrator_stop(o); }
  std::string address() const { return host + ":" + std::to_string(ruccl_orchestrator_port(o)); }
};

// transport: "" (default: shared memory between processes of this host) or "tcp"
// (RUCCL_TRANSPORT=tcp); log: a file for the node's stderr, with RUCCL_DEBUG=INFO;
// netns: run the node in that network namespace, its data port on node_address.
pid_t spawn_node(const std::vector<std::string> &args, const char *secret = kSecret,
                 const std::string &transport = "", const std::string &log = "", const std::string &netns = "",
                 const std::string &node_address = "") {
  std::vector<char *> argv;
  std::string bin = RUCCL_TEST_NODE_BIN;
  std::vector<std::string> prefix;
  if (!netns.empty()) prefix = {"ip", "netns", "exec", netns};
  for (auto &w : prefix) argv.push_back(const_cast<char *>(w.c_str()));
  argv.push_back(const_cast<char *>(bin.c_str()));
  for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char **e = environ; *e; e++)
    if (strncmp(*e, "RUCCL_SECRET=", 13) != 0 && strncmp(*e, "RUCCL_TRANSPORT=", 16) != 0 &&
        strncmp(*e, "RUCCL_DEBUG=", 12) != 0 && strncmp(*e, "RUCCL_TEST_NODE_ADDRESS=", 24) != 0)
      env_store.push_back(*e);
  if (!node_address.empty()) env_store.push_back("RUCCL_TEST_NODE_ADDRESS=" + node_address);
  env_store.push_back(std::string("RUCCL_SECRET=") + secret);
  if (!transport.empty()) env_store.push_back("RUCCL_TRANSPORT=" + transport);
  if (!log.empty()) env_store.push_back("RUCCL_DEBUG=INFO");
  std::vector<char *> envp;
  for (auto &e : env_store) envp.push_back(const_cast<char *>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log.empty()) posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  EXPECT_EQ(0, posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data()));
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// Waits for each process (at most limit_s in all, then kills it); returns exit codes
// (-1 for a process that had to be killed or died by a signal).
std::vector<int> wait_all(const std::vector<pid_t> &pids, int limit_s = 120) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  std::vector<int> codes(pids.size(), -2);
  size_t left = pids.size();
  while (left) {
    for (size_t i = 0; i < pids.size(); i++) {
      if (codes[i] != -2) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        left--;
      }
    }
    if (left && std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); i++)
        if (codes[i] == -2) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return codes;
}

std::vector<int> run_session(const std::vector<std::string> &node_ids, const std::string &group,
                             const std::string &scenario, const std::string &strategy = "auto",
                             const std::string &transport = "") {
  Orchestrator orch;
  std::vector<pid_t> pids;
  for (const auto &ids : node_ids)
    pids.push_back(spawn_node({orch.address(), std::to_string(node_ids.size()), group, ids, scenario, strategy},
                              kSecret, transport));
  return wait_all(pids);
}

// (strategy, transport between the processes)
class Strategies : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Strategies, TwoNodesTwoDevicesEveryCollective) {
  // ids interleave across the nodes: peer order is not node order
  auto [strategy, transport] = GetParam();
  auto codes = run_session({"0,3", "1,2"}, "two-by-two", "all", strategy, transport);
  EXPECT_EQ(std::vector<int>({0, 0}), codes);
}

TEST_P(Strategies, ThreeNodesOneDeviceEveryCollective) {
  auto [strategy, transport] = GetParam();
  auto codes = run_session({"2", "0", "1"}, "three-by-one", "all", strategy, transport);
  EXPECT_EQ(std::vector<int>({0, 0, 0}), codes);
}

TEST_P(Strategies, TenThousandMixedCollectives) {
  auto [strategy, transport] = GetParam();
  auto codes = run_session({"0,2", "1,3"}, "many", "many", strategy, transport);
  EXPECT_EQ(std::vector<int>({0, 0}), codes);
}

INSTANTIATE_TEST_SUITE_P(MultiNode, Strategies,
                         ::testing::Combine(::testing::Values("auto", "centralized", "tree", "ring"),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto &info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

std::string read_file(const std::string &path) {
  FILE *f = fopen(path.c_str(), "r");
  std::string text;
  if (!f) return text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  fclose(f);
  return text;
}

// Hosts of their own on this machine: a network namespace each, joined by a bridge
// (needs root), for sessions whose nodes must not share an address or a network.
class NetnsHosts {
 public:
  explicit NetnsHosts(int hosts) {
    tag_ = std::to_string(getpid() % 100000);
    subnet_ = "10.213." + std::to_string(getpid() % 250) + ".";
    std::string cmd = "set -e; ip link add rb" + tag_ + " type bridge; ip addr add " + host_address() +
                      "/24 dev rb" + tag_ + "; ip link set rb" + tag_ + " up";
    for (int k = 0; k < hosts; k++) {
      std::string ns = name(k), veth = "rv" + tag_ + "x" + std::to_string(k), inner = "rp" + tag_ + "x" + std::to_string(k);
      names_.push_back(ns);
      cmd += "; ip netns add " + ns + "; ip link add " + veth + " type veth peer name " + inner + "; ip link set " +
             inner + " netns " + ns + "; ip link set " + veth + " master rb" + tag_ + " up; ip -n " + ns +
             " addr add " + address(k) + "/24 dev " + inner + "; ip -n " + ns + " link set " + inner +
             " up; ip -n " + ns + " link set lo up";
    }
    ok_ = system((cmd + " 2>/dev/null").c_str()) == 0;
  }
  ~NetnsHosts() {
    std::string cmd;
    for (const auto &ns : names_) cmd += "ip netns del " + ns + " 2>/dev/null; ";
    cmd += "ip link del rb" + tag_ + " 2>/dev/null";
    if (system(cmd.c_str()) != 0) { /* nothing left to remove */ }
  }
  bool ok() const { return ok_; }
  // Cuts host k off: its link to the bridge goes down, and nothing passes either way
  // (no FIN, no RST: its connections are left half open).
  bool cut(int k) const {
    std::string cmd = "ip link set rv" + tag_ + "x" + std::to_string(k) + " down 2>/dev/null";
    return system(cmd.c_str()) == 0;
  }
  std::string name(int k) const { return "ruccl-" + tag_ + "-" + std::to_string(k); }
  std::string address(int k) const { return subnet_ + std::to_string(k + 2); }
  std::string host_address() const { return subnet_ + "1"; }

 private:
  std::string tag_, subnet_;
  std::vector<std::string> names_;
  bool ok_ = false;
};

// One node process per entry of node_ids, each with its stderr (RUCCL_DEBUG=INFO and
// the scenario's own lines) in a log file of its own, removed with the session.
struct LoggedNodes {
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  // hosts: node k runs on host k (its namespace and address)
  LoggedNodes(const Orchestrator &orch, const std::string &group, const std::vector<std::string> &node_ids,
              const std::string &scenario, const std::string &strategy, const std::string &transport,
              const NetnsHosts *hosts = nullptr) {
    for (size_t k = 0; k < node_ids.size(); k++) {
      logs.push_back("/tmp/ruccl-test-" + group + "-" + std::to_string(getpid()) + "-" + std::to_string(k) + ".log");
      pids.push_back(spawn_node({orch.address(), std::to_string(node_ids.size()), group, node_ids[k], scenario, strategy},
                                kSecret, transport, logs[k], hosts ? hosts->name((int)k) : "",
                                hosts ? hosts->address((int)k) : ""));
    }
  }
  ~LoggedNodes() {
    if (!getenv("KEEP_LOGS")) for (const auto &l : logs) unlink(l.c_str());
  }
  std::string log(size_t k) const { return read_file(logs[k]); }
};

TEST(MultiNode, ProcessesOfOneHostUseSharedMemoryUnlessTcpIsForced) {
  for (std::string transport : {"", "tcp"}) {
    Orchestrator orch;
    std::string log0 = "/tmp/ruccl-test-shm-" + std::to_string(getpid()) + "-0.log";
    std::string log1 = "/tmp/ruccl-test-shm-" + std::to_string(getpid()) + "-1.log";
    pid_t a = spawn_node({orch.address(), "2", "which", "0", "all"}, kSecret, transport, log0);
    pid_t b = spawn_node({orch.address(), "2", "which", "1", "all"}, kSecret, transport, log1);
    EXPECT_EQ(std::vector<int>({0, 0}), wait_all({a, b}));
    std::string text = read_file(log0) + read_file(log1);
    bool shm = text.find("shared memory with node") != std::string::npos;
    EXPECT_EQ(transport.empty(), shm) << "transport '" << transport << "': " << text.substr(0, 2000);
    unlink(log0.c_str());
    unlink(log1.c_str());
  }
}

// Each node links at set-up to node 0 and its neighbours in the ring of nodes only;
// other pairs link when an algorithm first moves data between them (every root of a
// tree), the higher node dialing.  Every collective stays right, and a node in the
// middle holds a handful of sockets where a full mesh would hold one per node.
TEST(MultiNode, NodesLinkToNodeZeroAndRingNeighboursThenWhereUsed) {
  const unsigned n = 7;
  for (std::string transport : {"", "tcp"}) {
    Orchestrator orch;
    std::vector<std::string> ids;
    for (unsigned k = 0; k < n; k++) ids.push_back(std::to_string(k));
    LoggedNodes nodes(orch, "links" + transport, ids, "links", "tree", transport);
    EXPECT_EQ(std::vector<int>(n, 0), wait_all(nodes.pids)) << nodes.log(3).substr(0, 3000);
    auto setup_pair = [&](unsigned a, unsigned b) {
      return a == 0 || b == 0 || (a + 1) % n == b || (b + 1) % n == a;
    };
    auto count = [](const std::string &text, const std::string &what) {
      int c = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) c++;
      return c;
    };
    int lazy = 0;
    std::vector<int> registered(n, -1);
    for (unsigned k = 0; k < n; k++) {
      std::string text = nodes.log(k);
      for (unsigned j = 0; j < k; j++) {
        std::string at_setup = "node " + std::to_string(k) + ": connected to node " + std::to_string(j) + " at ";
        std::string on_use = "node " + std::to_string(k) + ": linked to node " + std::to_string(j) + " on first use";
        EXPECT_EQ(setup_pair(k, j) ? 1 : 0, count(text, at_setup)) << at_setup;
        EXPECT_LE(count(text, on_use), setup_pair(k, j) ? 0 : 1) << on_use;  // once at most, never a set-up pair
        lazy += count(text, on_use);
      }
      size_t at = text.find("sockets-registered ");
      ASSERT_NE(std::string::npos, at) << text.substr(0, 2000);
      registered[k] = atoi(text.c_str() + at + strlen("sockets-registered "));
    }
    EXPECT_GT(lazy, 0) << "no pair linked on first use: trees of every root should need some";
    // node 0: a link to each node; node 3: three links; each also holds its data port, its
    // orchestrator connection and up to two liveness streams (a full mesh: 6 links)
    EXPECT_GE(registered[0], (int)n - 1 + 2) << transport;
    EXPECT_LE(registered[3], 3 + 4) << transport;
  }
}

// Between nodes of one peer each, an all-reduce of up to 4 KiB rides with the
// agreement (node 0 reduces the inputs that came with the descriptors) when the
// strategy between nodes is AUTO or CENTRALIZED; an explicit tree keeps its
// algorithm.  Every result stays right (every op, every size of "all"), and a shape
// mismatch leaves every output as it was and the session usable.
TEST(MultiNode, SmallAllReduceRidesWithTheAgreement) {
  const std::string fused = "with the agreement, reduced by node 0";
  for (std::string strategy : {"auto", "centralized", "tree"}) {
    Orchestrator orch;
    LoggedNodes nodes(orch, "fused-" + strategy, {"0", "1", "2"}, "all", strategy, "");
    EXPECT_EQ(std::vector<int>(3, 0), wait_all(nodes.pids)) << nodes.log(1).substr(0, 3000);
    for (size_t k = 0; k < 3; k++)
      EXPECT_EQ(strategy != "tree", nodes.log(k).find(fused) != std::string::npos) << strategy << ", node " << k;
  }
  Orchestrator orch;
  LoggedNodes nodes(orch, "fused-mismatch", {"0", "1", "2"}, "mismatch", "auto", "");
  EXPECT_EQ(std::vector<int>(3, 0), wait_all(nodes.pids)) << nodes.log(1).substr(0, 3000);
  EXPECT_NE(std::string::npos, nodes.log(2).find(fused)) << "the all-reduce after the mismatch";
}

TEST(MultiNode, ShapeMismatchIsSeenByEveryPeerAndTheSessionGoesOn) {
  auto codes = run_session({"0,3", "1,2"}, "mismatch", "mismatch");
  EXPECT_EQ(std::vector<int>({0, 0}), codes);
}

TEST(MultiNode, FinishedPeerIsReportedOnOtherNodes) {
  auto codes = run_session({"0,3", "1,2"}, "finish", "finish");
  EXPECT_EQ(std::vector<int>({0, 0}), codes);
}

class Transports : public ::testing::TestWithParam<std::string> {};

// 3 nodes of 2 peers (0,1 | 2,3 | 4,5) loop over 32 MB ring all-reduces (scenario
// "big"); once every peer has completed one and is in the next, node 1 gets `sig`
// (then SIGKILL, for a frozen one).  What the survivors (nodes 0 and 2) did.
struct SignalledSession {
  bool under_way;          // every peer reported its all-reduces running before the signal
  std::vector<int> codes;  // nodes 0 and 2: 3 is RUCCL_ERR_PEER_LOST
  double took;             // seconds from the signal until both survivors exited
  std::string text;        // their logs
};

// Three nodes of two peers in 32 MB all-reduces; once every peer is under way,
// disturb(node 1's pid) (a signal, a cut link); then the survivors' exits are timed.
// hosts: each node on a host of its own.
SignalledSession disturb_mid_all_reduce(const std::string &group, const std::string &transport,
                                        const std::function<void(pid_t)> &disturb,
                                        const NetnsHosts *hosts = nullptr) {
  Orchestrator orch(hosts ? hosts->host_address() : "127.0.0.1");
  const std::vector<std::string> ids = {"0,1", "2,3", "4,5"};
  LoggedNodes nodes(orch, group, ids, "big", "ring", transport, hosts);
  const std::vector<pid_t> &pids = nodes.pids;
  auto running = [&] {
    std::string all;
    for (size_t k = 0; k < ids.size(); k++) all += nodes.log(k);
    for (int id = 0; id < 6; id++)
      if (all.find("peer " + std::to_string(id) + ": running") == std::string::npos) return false;
    return true;
  };
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  SignalledSession r;
  r.under_way = running();
  if (!r.under_way) return r;
  disturb(pids[1]);
  auto start = std::chrono::steady_clock::now();
  r.codes = wait_all({pids[0], pids[2]}, 60);
  r.took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  kill(pids[1], SIGKILL);
  waitpid(pids[1], nullptr, 0);
  r.text = nodes.log(0) + nodes.log(2);
  return r;
}

SignalledSession signal_mid_all_reduce(const std::string &group, int sig, const std::string &transport) {
  return disturb_mid_all_reduce(group, transport, [sig](pid_t pid) { kill(pid, sig); });
}

// Every surviving peer (not only each survivor process) must end with PEER_LOST, and
// the kill comes once every peer has completed a 32 MB all-reduce and is in the next.
TEST_P(Transports, KilledNodeMidAllReduceIsPeerLostForTheSurvivors) {
  SignalledSession r = signal_mid_all_reduce("kill", SIGKILL, GetParam());
  ASSERT_TRUE(r.under_way) << "the peers never reported their all-reduces under way";
  EXPECT_EQ(std::vector<int>({3, 3}), r.codes) << "survivor nodes must end with RUCCL_ERR_PEER_LOST";
  for (int id : {0, 1, 4, 5})
    EXPECT_NE(std::string::npos, r.text.find("peer " + std::to_string(id) + ": big ended with RUCCL_ERR_PEER_LOST"))
        << "peer " << id << ": " << r.text.substr(r.text.size() > 3000 ? r.text.size() - 3000 : 0);
  EXPECT_LT(r.took, 20.0) << "survivors must not wait for their timeout";
}

TEST_P(Transports, PointToPointAcrossNodes) {
  for (const std::vector<std::string> &nodes : {std::vector<std::string>{"0", "1", "2"},
                                                std::vector<std::string>{"0,1", "2,3"}}) {
    Orchestrator orch;
    std::vector<pid_t> pids;
    for (const auto &ids : nodes)
      pids.push_back(spawn_node({orch.address(), std::to_string(nodes.size()), "p2p", ids, "p2p"}, kSecret,
                                GetParam()));
    EXPECT_EQ(std::vector<int>(nodes.size(), 0), wait_all(pids)) << nodes.size() << " nodes";
  }
}

// Gloo's point-to-point habits across processes: 64 MB sent both ways before any
// receive, a receive from any peer (non-leaders across nodes included).
TEST_P(Transports, PointToPointLikeGloo) {
  for (const std::vector<std::string> &nodes : {std::vector<std::string>{"0", "1"},
                                                std::vector<std::string>{"0,1", "2,3", "4,5"}}) {
    Orchestrator orch;
    std::vector<pid_t> pids;
    for (const auto &ids : nodes)
      pids.push_back(spawn_node({orch.address(), std::to_string(nodes.size()), "p2pbig", ids, "p2pbig"}, kSecret,
                                GetParam()));
    EXPECT_EQ(std::vector<int>(nodes.size(), 0), wait_all(pids)) << nodes.size() << " nodes";
  }
}

// ruccl_reset() while this node's two peers wait across nodes: RESET for both within
// a second (not PEER_LOST), PEER_LOST for the other node.
TEST_P(Transports, ResetInAMultiNodeSessionIsResetForEveryLocalPeer) {
  Orchestrator orch;
  std::vector<pid_t> pids;
  for (const std::string ids : {"0,1", "2,3"})
    pids.push_back(spawn_node({orch.address(), "2", "reset", ids, "reset"}, kSecret, GetParam()));
  EXPECT_EQ(std::vector<int>(2, 0), wait_all(pids));
}

// Sets an environment variable for the nodes spawned in its scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string &n, const std::string &value) : name(n) { setenv(n.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

// Messages no receive wants yet are held up to RUCCL_P2P_UNEXPECTED_MB a peer; past it
// the stream pauses and the sender waits for the receives (backpressure), instead of
// the receiver's memory growing without bound.  Without the bound the same 32 MB is
// held at once and the sends finish long before the receives are posted.
TEST_P(Transports, UnexpectedMessagesPauseTheirStreamPastTheBound) {
  for (int bounded : {1, 0}) {
    ScopedEnv cap("RUCCL_P2P_UNEXPECTED_MB", bounded ? "2" : "1024");
    ScopedEnv expect("RUCCL_TEST_EXPECT_PAUSE", bounded ? "1" : "0");
    Orchestrator orch;
    std::vector<pid_t> pids;
    for (const std::string ids : {"0", "1"})
      pids.push_back(spawn_node({orch.address(), "2", "flood", ids, "p2pflood"}, kSecret, GetParam()));
    EXPECT_EQ(std::vector<int>(2, 0), wait_all(pids)) << (bounded ? "bounded at 2 MB" : "1 GiB");
  }
}

// Node 1 of 3 frozen mid all-reduce: every surviving peer ends with PEER_LOST, and
// node 2, its successor, names the silent node.
// With RUCCL_SHM_LINKS=1 a process holds at most one shared-memory pair; its other
// pairs go over TCP, and every collective (trees of every root) stays right.
TEST(MultiNode, SharedMemoryPairsAreBoundedAndTheRestUseTcp) {
  ScopedEnv budget("RUCCL_SHM_LINKS", "1");
  const unsigned n = 5;
  Orchestrator orch;
  std::vector<std::string> ids;
  for (unsigned k = 0; k < n; k++) ids.push_back(std::to_string(k));
  LoggedNodes nodes(orch, "shm-budget", ids, "all", "tree", "");
  EXPECT_EQ(std::vector<int>(n, 0), wait_all(nodes.pids)) << nodes.log(0).substr(0, 3000);
  std::vector<int> pairs(n, 0);  // shared-memory pairs each node holds
  int total = 0;
  for (unsigned k = 0; k < n; k++) {
    std::string text = nodes.log(k);
    for (unsigned j = k + 1; j < n; j++)  // the lower node of a pair logs it
      if (text.find("node " + std::to_string(k) + ": shared memory with node " + std::to_string(j) + "\n") !=
          std::string::npos)
        pairs[k]++, pairs[j]++, total++;
  }
  for (unsigned k = 0; k < n; k++) EXPECT_LE(pairs[k], 1) << "node " << k;
  EXPECT_GE(total, 1) << "no pair used shared memory at all";
}

// Every survivor ended with PEER_LOST, and node 2, node 1's successor, named it.
void expect_survivors_lost(const SignalledSession &r) {
  ASSERT_TRUE(r.under_way) << "the peers never reported their all-reduces under way";
  EXPECT_EQ(std::vector<int>({3, 3}), r.codes)
      << "survivor nodes must end with RUCCL_ERR_PEER_LOST (1: another code, such as the collectives' TIMEOUT)\n"
      << r.text.substr(r.text.size() > 3000 ? r.text.size() - 3000 : 0);
  for (int id : {0, 1, 4, 5})
    EXPECT_NE(std::string::npos, r.text.find("peer " + std::to_string(id) + ": big ended with RUCCL_ERR_PEER_LOST"))
        << "peer " << id;
  EXPECT_NE(std::string::npos, r.text.find("node 1 sent nothing for")) << "node 2, its successor, names the silent node";
}

void expect_frozen_node_lost(const std::string &group, const std::string &transport) {
  expect_survivors_lost(signal_mid_all_reduce(group, SIGSTOP, transport));
}

// Liveness: a node frozen (SIGSTOP) in the middle of all-reduces is PEER_LOST for
// every survivor after the liveness timeout (1.5 s here), not TIMEOUT after the
// collectives' own 20 s: its successor notices the silence, and the abort notices
// carry the code to the node that does not watch it.
TEST_P(Transports, FrozenNodeIsPeerLostForEverySurvivor) {
  ScopedEnv liveness("RUCCL_LIVENESS_TIMEOUT_MS", "1500");
  expect_frozen_node_lost("freeze", GetParam());
}

// A node that crashes right after it got the table never links: the orchestrator sees
// its connection close without LEAVE and tells the others, and a node that dials or
// probes it finds its data port closed, so every other node fails its registration
// with PEER_LOST at once, not TIMEOUT after the session's 20 s.
TEST(MultiNode, NodeThatDiesAfterTheTableIsPeerLostForTheOthersAtSetUp) {
  for (const char *victim : {"1", "3"}) {  // a middle node (dialled and dialling), the last (only dialling)
    ScopedEnv die("RUCCL_TEST_DIE_AFTER_TABLE_PEER", victim);
    Orchestrator orch;
    const std::vector<std::string> ids = {"0", "1", "2", "3"};
    auto t0 = std::chrono::steady_clock::now();
    LoggedNodes nodes(orch, std::string("diesat") + victim, ids, "all", "auto", "");
    std::vector<int> codes = wait_all(nodes.pids, 60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int v = atoi(victim);
    for (int k = 0; k < 4; k++) {
      if (k == v) {
        EXPECT_EQ(7, codes[k]) << "the victim exits after its table";
        continue;
      }
      EXPECT_EQ(1, codes[k]) << "node " << k;
      // at registration (linked to the victim at set-up), or in the first all-reduce
      std::string log = nodes.log((size_t)k), mine = "peer " + std::to_string(k) + ": ";
      size_t at = log.rfind("\n" + mine);
      if (at != std::string::npos) at++;
      else if (log.compare(0, mine.size(), mine) == 0) at = 0;
      std::string line = at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
      EXPECT_NE(std::string::npos, line.find("RUCCL_ERR_PEER_LOST")) << "node " << k << " must end with PEER_LOST: " << log;
    }
    // node 0 waits for the victim's link at set-up: the orchestrator's word ends that
    // wait, or, when it comes first, node 0's probe of the victim's closed data port
    // (both name the victim; which one wins is a race between two processes)
    const std::string log0 = nodes.log(0);
    bool told = log0.find(std::string("the orchestrator says the node of peer ") + victim) != std::string::npos;
    size_t port_at = log0.find(std::string("node ") + victim + "'s data port at ");
    std::string port_line = port_at == std::string::npos ? "" : log0.substr(port_at, log0.find('\n', port_at) - port_at);
    bool probed = port_line.find("refuses connections: its session ended") != std::string::npos;
    EXPECT_TRUE(told || probed) << log0;
    EXPECT_LT(took, 10.0) << "the others waited for the session's timeout";
  }
}

// A node silent from the start (as if frozen before its first beat): its successor
// gives it the set-up grace (RUCCL_LIVENESS_SETUP_GRACE_MS, 3 s here; by default
// 2 min), not the session's whole timeout, and every survivor ends with PEER_LOST.
TEST_P(Transports, NodeSilentFromTheStartIsPeerLostAfterTheSetUpGrace) {
  ScopedEnv liveness("RUCCL_LIVENESS_TIMEOUT_MS", "1500");
  ScopedEnv grace("RUCCL_LIVENESS_SETUP_GRACE_MS", "3000");
  ScopedEnv silent("RUCCL_TEST_SILENT_PEER", "2");  // node 1 ("2,3")
  // Timed from the start: the silence begins with the session (under TSan the grace
  // can end before every peer has finished its first 32 MB all-reduce).
  Orchestrator orch;
  auto t0 = std::chrono::steady_clock::now();
  LoggedNodes nodes(orch, "silent", {"0,1", "2,3", "4,5"}, "big", "ring", GetParam());
  std::vector<int> codes = wait_all({nodes.pids[0], nodes.pids[2]}, 60);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(nodes.pids[1], SIGKILL);
  waitpid(nodes.pids[1], nullptr, 0);
  std::string text = nodes.log(0) + nodes.log(2);
  EXPECT_EQ(std::vector<int>({3, 3}), codes) << "survivor nodes must end with RUCCL_ERR_PEER_LOST\n"
                                             << text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
  EXPECT_NE(std::string::npos, text.find("node 1 sent nothing for")) << "node 2, its successor, names the silent node";
  EXPECT_LT(took, 15.0) << "the survivors waited for the session's 20 s timeout";
}

// The liveness timeout set through the configuration wins over the environment: with
// RUCCL_LIVENESS_TIMEOUT_MS=0 (no watch) and ruccl_config_set_liveness_timeout_ms(1500),
// a frozen node is PEER_LOST for every survivor, as above.
TEST_P(Transports, LivenessTimeoutFromTheConfigurationWinsOverTheEnvironment) {
  ScopedEnv off("RUCCL_LIVENESS_TIMEOUT_MS", "0");
  ScopedEnv api("RUCCL_TEST_LIVENESS_API_MS", "1500");
  expect_frozen_node_lost("freezeapi", GetParam());
}

// Nodes must agree on the liveness timeout (one that does not watch does not beat, and
// a watching successor would take its silence for a loss): a node with its own is a
// configuration mismatch for every node, at registration.
TEST(MultiNode, NodesWithDifferentLivenessTimeoutsAreAConfigurationMismatch) {
  Orchestrator orch;
  std::string logs[2] = {"/tmp/ruccl-test-livemis-" + std::to_string(getpid()) + "-0.log",
                         "/tmp/ruccl-test-livemis-" + std::to_string(getpid()) + "-1.log"};
  pid_t a, b;
  {
    ScopedEnv api("RUCCL_TEST_LIVENESS_API_MS", "0");
    a = spawn_node({orch.address(), "2", "livemis", "0", "all"}, kSecret, "", logs[0]);
  }
  b = spawn_node({orch.address(), "2", "livemis", "1", "all"}, kSecret, "", logs[1]);
  EXPECT_EQ(std::vector<int>({1, 1}), wait_all({a, b}));
  for (const auto &l : logs) {
    std::string text = read_file(l);
    EXPECT_NE(std::string::npos, text.find("register: RUCCL_ERR_CONFIG_MISMATCH")) << text.substr(0, 2000);
    if (!getenv("KEEP_LOGS")) unlink(l.c_str());
  }
}

// No false alarm: nodes that make no call for 4 s (a compute phase), 8 liveness
// timeouts of 500 ms, go on as before; their own threads kept beating.
TEST_P(Transports, NodesQuietForManyLivenessTimeoutsGoOn) {
  ScopedEnv liveness("RUCCL_LIVENESS_TIMEOUT_MS", "500");
  ScopedEnv idle("RUCCL_TEST_IDLE_MS", "4000");
  Orchestrator orch;
  std::vector<pid_t> pids;
  for (const std::string ids : {"0,1", "2,3", "4,5"})
    pids.push_back(spawn_node({orch.address(), "3", "quiet", ids, "idle"}, kSecret, GetParam()));
  EXPECT_EQ(std::vector<int>(3, 0), wait_all(pids));
}

// An ABORT racing a payload: 200 rounds (RUCCL_RACE_ROUNDS) of a 4 MB all-reduce on
// 2 nodes of 2 peers that one peer aborts at a varying moment; every peer on both
// nodes must report ABORTED, never a lost peer or a notice read as data.
TEST_P(Transports, AbortRacingAPayloadIsAbortedEverywhere) {
  Orchestrator orch;
  std::vector<pid_t> pids;
  for (const std::string ids : {"0,1", "2,3"})
    pids.push_back(spawn_node({orch.address(), "2", "race0", ids, "abortrace"}, kSecret, GetParam()));
  EXPECT_EQ(std::vector<int>(2, 0), wait_all(pids, 240));
}

INSTANTIATE_TEST_SUITE_P(MultiNode, Transports, ::testing::Values("shm", "tcp"),
                         [](const auto &info) { return info.param; });

// "Every participant of an all-reduce gets bit-identical results, whatever the
// strategy": pseudo-random floats (not small integers, whose sums are exact in any
// order), several sizes (one ring slice and several, ragged ends), every strategy,
// three nodes and two nodes of two interleaved peers, each peer's output hashed and
// compared bit for bit with every other peer's.
class BitIdentical : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(BitIdentical, EveryPeerOfEveryNodeGetsTheSameBits) {
  auto [strategy, transport, layout] = GetParam();
  std::vector<std::string> nodes = layout == "2x2" ? std::vector<std::string>{"0,3", "1,2"}
                                                   : std::vector<std::string>{"2", "0", "1"};
  Orchestrator orch;
  LoggedNodes session(orch, "bits", nodes, "bits", strategy, transport);
  auto codes = wait_all(session.pids);
  std::map<unsigned, std::set<std::string>> hashes;
  std::map<unsigned, int> lines;
  std::string all;
  for (size_t k = 0; k < nodes.size(); k++) {
    std::string text = "\n" + session.log(k);
    all += text;
    for (size_t at = 0; (at = text.find("\nbits ", at)) != std::string::npos; at++) {
      unsigned c;
      char h[17] = {0};
      if (sscanf(text.c_str() + at + 1, "bits %u %16s", &c, h) == 2) hashes[c].insert(h), lines[c]++;
    }
  }
  EXPECT_EQ(std::vector<int>(nodes.size(), 0), codes) << all.substr(0, 3000);
  ASSERT_EQ(16u, hashes.size()) << all.substr(0, 3000);
  for (const auto &[c, set] : hashes) {
    EXPECT_EQ(layout == "2x2" ? 4 : 3, lines[c]) << "case " << c << ": every peer reports";
    EXPECT_EQ(1u, set.size()) << "case " << c << ": the peers' results differ in their bits";
  }
}

INSTANTIATE_TEST_SUITE_P(MultiNode, BitIdentical,
                         ::testing::Combine(::testing::Values("auto", "centralized", "tree", "ring"),
                                            ::testing::Values("shm", "tcp"), ::testing::Values("3x1", "2x2")),
                         [](const auto &info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

// The host-staged path between processes (as several processes on one GPU take it):
// each node's memory poses as a device the host cannot reach, so every collective
// copies through pinned buffers, the large ones in slices; every peer checks its
// results, and each node says at RUCCL_DEBUG=INFO which path it took and why.
class StagedAcrossProcesses : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(StagedAcrossProcesses, EveryCollectiveIsRight) {
  auto [scenario, transport, layout] = GetParam();
  std::vector<std::string> nodes = layout == "2x2" ? std::vector<std::string>{"0,3", "1,2"}
                                                   : std::vector<std::string>{"2", "0", "1"};
  setenv("RUCCL_TEST_PRETEND_DEVICES", "3", 1);
  setenv("RUCCL_DEBUG", "INFO", 1);
  Orchestrator orch;
  LoggedNodes session(orch, "staged" + scenario + transport + layout, nodes, scenario, "auto", transport);
  unsetenv("RUCCL_TEST_PRETEND_DEVICES");
  unsetenv("RUCCL_DEBUG");
  auto codes = wait_all(session.pids);
  std::string all;
  for (size_t k = 0; k < nodes.size(); k++) all += session.log(k);
  EXPECT_EQ(std::vector<int>(nodes.size(), 0), codes) << all.substr(0, 3000);
  EXPECT_NE(all.find("takes the host-staged path: participant 0 has no usable NCCL"), std::string::npos)
      << all.substr(0, 3000);
  EXPECT_EQ(all.find("takes the host path"), std::string::npos) << all.substr(0, 3000);
}

INSTANTIATE_TEST_SUITE_P(MultiNode, StagedAcrossProcesses,
                         ::testing::Combine(::testing::Values("all", "staged"), ::testing::Values("shm", "tcp"),
                                            ::testing::Values("3x1", "2x2")),
                         [](const auto &info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

// The finish race: every peer finishes as soon as its part of the last collective
// is done, while one peer (the first of the last node) sleeps in the last receiving
// step of that collective, and again in a point-to-point receive from peer 0 (a test
// hook, testing.h).  What the finished peers sent must still arrive, whole and
// right, over shared memory and over TCP, with every strategy; the small case also
// checks from the nodes' clocks that every other node had entered ruccl_finish
// before the laggard woke, so the race did happen.
class FinishRace : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(FinishRace, LaggingPeerGetsWhatAFinishedPeerSent) {
  auto [strategy, transport, layout] = GetParam();
  bool big = layout.find("big") != std::string::npos;
  std::vector<std::string> nodes = layout.rfind("2x2", 0) == 0 ? std::vector<std::string>{"0,1", "2,3"}
                                                               : std::vector<std::string>{"0", "1", "2"};
  Orchestrator orch;
  LoggedNodes session(orch, "lag", nodes, big ? "lagfinish-big" : "lagfinish", strategy, transport);
  auto codes = wait_all(session.pids);
  std::string all;
  long long woke = 0, last_finish_elsewhere = 0;
  for (size_t k = 0; k < nodes.size(); k++) {
    std::string text = session.log(k);
    all += text;
    for (size_t at = 0; (at = text.find("finish-enter ", at)) != std::string::npos; at++) {
      unsigned id;
      long long ns;
      if (k + 1 < nodes.size() && sscanf(text.c_str() + at, "finish-enter %u %lld", &id, &ns) == 2)
        last_finish_elsewhere = std::max(last_finish_elsewhere, ns);
    }
    size_t at = text.find("laggard-woke ");
    long long p2p_woke;
    if (at != std::string::npos) sscanf(text.c_str() + at, "laggard-woke %lld %lld", &woke, &p2p_woke);
  }
  EXPECT_EQ(std::vector<int>(nodes.size(), 0), codes) << all.substr(0, 4000);
  ASSERT_GT(woke, 0) << "the laggard's delayed step never ran: " << all.substr(0, 4000);
  ASSERT_GT(last_finish_elsewhere, 0) << all.substr(0, 4000);
  if (!big) {
    EXPECT_LT(last_finish_elsewhere, woke) << "every other node must have entered ruccl_finish before the laggard "
                                              "woke, or the race was not exercised";
  }
}

INSTANTIATE_TEST_SUITE_P(MultiNode, FinishRace,
                         ::testing::Combine(::testing::Values("auto", "centralized", "tree", "ring"),
                                            ::testing::Values("shm", "tcp"), ::testing::Values("3x1", "2x2", "3x1_big")),
                         [](const auto &info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

int free_port() {
  int fd, port;
  EXPECT_EQ(RUCCL_OK, ruccl_tcp_listen("127.0.0.1", 0, &fd, &port));
  close(fd);
  return port;
}

TEST(MultiNode, StrangersOnADataPortAreRefusedWithoutDisturbingTheSession) {
  Orchestrator orch;
  int port = free_port();
  pid_t a = spawn_node({orch.address(), "2", "strangers", "0,2", "many", "auto", std::to_string(port)});
  pid_t b = spawn_node({orch.address(), "2", "strangers", "1,3", "many"});
  int64_t until = ruccl_now_ns() + 1500LL * 1000000;
  int attempts = 0;
  while (ruccl_now_ns() < until) {
    int fd;
    if (ruccl_tcp_connect("127.0.0.1", port, ruccl_now_ns() + 200000000, &fd) != RUCCL_OK) continue;
    attempts++;
    if (attempts % 3 == 1) {  // garbage, an oversized frame header included
      const unsigned char junk[] = {0x52, 0x55, 0x43, 0x43, 0, 2, 0, 0, 0xff, 0xff, 0xff, 0xff, 'x', 'y'};
      ruccl_write_all(fd, junk, sizeof junk, ruccl_now_ns() + 200000000);
    } else if (attempts % 3 == 2) {  // a client with the wrong secret
      unsigned char key[RUCCL_AUTH_KEY_BYTES];
      ASSERT_EQ(RUCCL_OK, ruccl_auth_key("wrong", 5, key));
      EXPECT_EQ(RUCCL_ERR_AUTH, ruccl_auth_client(fd, key, kNodeHello, nullptr, 0, ruccl_now_ns() + 2000000000LL));
    } else {  // the right secret, for another group (and no session's id): proven, then dropped
      unsigned char key[RUCCL_AUTH_KEY_BYTES], context[64 + 16 + 8] = {};
      snprintf(reinterpret_cast<char *>(context), 64, "another-group");
      context[64 + 16 + 3] = 1;  // "node 1"
      ASSERT_EQ(RUCCL_OK, ruccl_auth_key(kSecret, strlen(kSecret), key));
      EXPECT_EQ(RUCCL_OK, ruccl_auth_client(fd, key, kNodeHello, context, sizeof context, ruccl_now_ns() + 2000000000LL));
      char byte;
      EXPECT_EQ(RUCCL_ERR_PEER_LOST, ruccl_read_all(fd, &byte, 1, ruccl_now_ns() + 3000000000LL))
          << "the node took a link proven for another group";
    }
    close(fd);
  }
  EXPECT_GT(attempts, 2);
  EXPECT_EQ(std::vector<int>({0, 0}), wait_all({a, b}));
}

// Connections that open a node's data port and say nothing hold a handshake slot
// each (15 s), never the port: the node's set-up links and the ones made on first use
// (trees of every root) come in beside them.  Served one at a time, 8 silent strangers
// would hold it for two minutes.
TEST(MultiNode, SilentStrangersDoNotHoldUpTheDataPort) {
  Orchestrator orch;
  int port = free_port();
  const unsigned n = 6;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (unsigned k = 0; k < n; k++)  // node 1 (peer 1) listens on port
    pids.push_back(spawn_node({orch.address(), std::to_string(n), "silent", std::to_string(k), "all", "tree",
                               k == 1 ? std::to_string(port) : "0"}));
  std::vector<int> strangers;
  int64_t until = ruccl_now_ns() + 5000LL * 1000000;
  while (strangers.size() < 8 && ruccl_now_ns() < until) {
    int fd;
    if (ruccl_tcp_connect("127.0.0.1", port, ruccl_now_ns() + 100000000, &fd) == RUCCL_OK) strangers.push_back(fd);
  }
  EXPECT_EQ(8u, strangers.size());
  EXPECT_EQ(std::vector<int>(n, 0), wait_all(pids));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 14.0) << "the session waited for the strangers' handshakes";
  for (int fd : strangers) close(fd);
}

TEST(MultiNode, DataPortInUseIsAnIoError) {
  Orchestrator orch;
  ruccl_config_t cfg = ruccl_config_default();
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_nodes(&cfg, 2));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_global_address(&cfg, orch.address().c_str()));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_node_address(&cfg, "127.0.0.1"));
  // the orchestrator holds this port
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&cfg, (unsigned)ruccl_orchestrator_port(orch.o)));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_timeout_ms(&cfg, 2000));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_secret(&cfg, kSecret, strlen(kSecret)));
  ruccl_comm_t *comm = nullptr;
  EXPECT_EQ(RUCCL_ERR_IO, ruccl_register(0, {RUCCL_DEVICE_CPU, 0}, &cfg, &comm));
  EXPECT_NE(nullptr, strstr(ruccl_last_error(), "in use")) << ruccl_last_error();
  EXPECT_EQ(nullptr, comm);
}

// The rendezvous through a key-value store (what the PyTorch backend does with
// torch's store): no orchestrator; the store outlives one session and serves the
// next; a differing configuration is seen by every node.
struct StoreDir {
  std::string path;
  StoreDir() {
    char tmpl[] = "/tmp/ruccl-store-XXXXXX";
    path = mkdtemp(tmpl) ? tmpl : "";
    EXPECT_FALSE(path.empty());
  }
  ~StoreDir() {
    std::string cmd = "rm -rf '" + path + "'";
    EXPECT_EQ(0, system(cmd.c_str()));
  }
};

TEST(MultiNode, StoreRendezvousRunsSessionAfterSession) {
  StoreDir dir;
  for (int session = 0; session < 2; session++) {
    std::vector<pid_t> pids;
    for (std::string ids : session ? std::vector<std::string>{"0,1", "2,3"} : std::vector<std::string>{"0,3", "1,2"})
      pids.push_back(spawn_node({"dir:" + dir.path, "2", "viastore", ids, session ? "p2p" : "all"}));
    EXPECT_EQ(std::vector<int>({0, 0}), wait_all(pids)) << "session " << session;
  }
}

TEST(MultiNode, StoreRendezvousConfigMismatchIsSeenByEveryNode) {
  StoreDir dir;
  std::vector<std::string> logs;
  std::vector<pid_t> pids;
  const char *strategies[] = {"ring", "tree"};
  for (int k = 0; k < 2; k++) {
    logs.push_back(dir.path + "-node" + std::to_string(k) + ".log");
    pids.push_back(spawn_node({"dir:" + dir.path, "2", "viastore", std::to_string(k), "all", strategies[k]}, kSecret,
                              "", logs.back()));
  }
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(std::vector<int>({1, 1}), wait_all(pids));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15.0)
      << "a mismatch must not wait for the timeout";
  for (const auto &log : logs) {
    std::string text = read_file(log);
    EXPECT_NE(std::string::npos, text.find("RUCCL_ERR_CONFIG_MISMATCH")) << text.substr(0, 2000);
    unlink(log.c_str());
  }
}

// A job restarted on the same store (torchrun keeps its store across restarts) after an
// attempt that died while it started: two nodes of a 4-node group took their tickets and
// published, then were killed before the other two came.  The next attempt's first two
// nodes land in that dead session, the other two in the next one; without a check every
// restart would split the same way.  The first two see the dead session's first node
// gone (its data port refuses) and take new tickets: all four meet in the next session,
// long before the registration's 20 s timeout.
TEST(MultiNode, StoreRendezvousSkipsADeadAttemptsSession) {
  StoreDir dir;
  std::vector<pid_t> dead;
  for (int k = 0; k < 2; k++) dead.push_back(spawn_node({"dir:" + dir.path, "4", "viastore", std::to_string(k), "all"}));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int k = 0; k < 2; k++) {
    std::string key = dir.path + "/ruccl_viastore_0_node_" + std::to_string(k);
    while (access(key.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(0, access(key.c_str(), F_OK)) << "the first attempt's node did not publish its JOIN";
  }
  for (pid_t p : dead) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 4; k++) {
    logs.push_back(dir.path + "-node" + std::to_string(k) + ".log");
    pids.push_back(spawn_node({"dir:" + dir.path, "4", "viastore", std::to_string(k), "all"}, kSecret, "", logs.back()));
  }
  std::vector<int> codes = wait_all(pids, 60);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string all;
  for (const auto &log : logs) {
    all += read_file(log);
    unlink(log.c_str());
  }
  EXPECT_EQ(std::vector<int>(4, 0), codes) << all.substr(0, 4000);
  EXPECT_NE(std::string::npos, all.find("is a dead attempt's")) << "no node skipped the dead session:\n"
                                                                   << all.substr(0, 4000);
  EXPECT_LT(took, 15.0) << "the restarted nodes waited for the timeout";
}

// The same crash with a rendezvous through a store (as under torch): no orchestrator
// says the node went, but its data port, open since before it joined, now refuses
// connections; a node awaiting its link probes it each second, so every survivor
// ends with PEER_LOST within seconds, not at the registration's 20 s timeout.
TEST(MultiNode, NodeThatDiesAfterTheStoresTableIsPeerLostForTheOthersAtSetUp) {
  for (const char *victim : {"1", "3"}) {
    ScopedEnv die("RUCCL_TEST_DIE_AFTER_TABLE_PEER", victim);
    StoreDir dir;
    std::vector<pid_t> pids;
    std::vector<std::string> logs;
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 4; k++) {
      logs.push_back(dir.path + "-node" + std::to_string(k) + ".log");
      pids.push_back(spawn_node({"dir:" + dir.path, "4", std::string("storedies") + victim, std::to_string(k), "all"},
                                kSecret, "", logs.back()));
    }
    std::vector<int> codes = wait_all(pids, 60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int v = atoi(victim);
    bool probed = false;
    for (int k = 0; k < 4; k++) {
      std::string log = read_file(logs[k]);
      unlink(logs[k].c_str());
      if (k == v) {
        EXPECT_EQ(7, codes[k]) << "the victim exits after its table";
        continue;
      }
      EXPECT_EQ(1, codes[k]) << "node " << k << ": " << log;
      EXPECT_NE(std::string::npos, log.find("RUCCL_ERR_PEER_LOST")) << "node " << k << ": " << log;
      EXPECT_EQ(std::string::npos, log.find("RUCCL_ERR_TIMEOUT")) << "node " << k << ": " << log;
      probed = probed || log.find("refuses connections: its session ended") != std::string::npos;
    }
    EXPECT_TRUE(probed) << "node 0 awaits the victim's link: its probe must be what ended the wait";
    EXPECT_LT(took, 10.0) << "the others waited for the session's timeout";
  }
}

// A node frozen (SIGSTOP) right after the table: its kernel still takes connections on
// its data port, so it is neither refused nor announced.  A node that dials it waits for
// the handshake's answer, a node that awaits it probes for that answer, each for the
// set-up grace (RUCCL_LIVENESS_SETUP_GRACE_MS) at most: PEER_LOST, not the timeout.
// Two nodes: node 0 only awaits node 1 (the probe ends it); four nodes: node 2 dials
// node 1 (its wait for the answer ends it; the others may hear of the loss from a
// neighbour first).
TEST(MultiNode, NodeFrozenAfterTheStoresTableIsPeerLostForTheOthersAfterTheSetUpGrace) {
  ScopedEnv freeze("RUCCL_TEST_FREEZE_AFTER_TABLE_PEER", "1");
  ScopedEnv grace("RUCCL_LIVENESS_SETUP_GRACE_MS", "3000");
  ScopedEnv liveness("RUCCL_LIVENESS_TIMEOUT_MS", "2000");
  for (int nodes : {2, 4}) {
    StoreDir dir;
    std::vector<pid_t> pids, survivors;
    std::vector<std::string> logs;
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < nodes; k++) {
      logs.push_back(dir.path + "-node" + std::to_string(k) + ".log");
      pids.push_back(spawn_node({"dir:" + dir.path, std::to_string(nodes), "storefreezes", std::to_string(k), "all"},
                                kSecret, "", logs.back()));
      if (k != 1) survivors.push_back(pids.back());
    }
    std::vector<int> codes = wait_all(survivors, 60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int status = 0;
    EXPECT_EQ(0, waitpid(pids[1], &status, WNOHANG)) << nodes << " nodes: the frozen node must still be there";
    kill(pids[1], SIGKILL);
    waitpid(pids[1], &status, 0);
    std::string all;
    for (int k = 0, i = 0; k < nodes; k++) {
      std::string log = read_file(logs[k]);
      unlink(logs[k].c_str());
      if (k == 1) continue;
      all += "node " + std::to_string(k) + ":\n" + log;
      EXPECT_EQ(1, codes[i++]) << nodes << " nodes, node " << k << ": " << log;
      // what the call returned (a step on the way may have logged a socket's timeout)
      EXPECT_TRUE(std::regex_search(log, std::regex("\npeer [0-9]+: [^\n]*RUCCL_ERR_PEER_LOST")))
          << nodes << " nodes, node " << k << ": " << log;
      EXPECT_FALSE(std::regex_search(log, std::regex("\npeer [0-9]+: [^\n]*RUCCL_ERR_TIMEOUT")))
          << nodes << " nodes, node " << k << ": " << log;
    }
    const char *how = nodes == 2 ? "takes connections but answered none" : "took the connection but answered nothing";
    EXPECT_NE(std::string::npos, all.find(how)) << nodes << " nodes: the set-up wait must be what saw it\n" << all;
    EXPECT_LT(took, 12.0) << nodes << " nodes: the others waited for the session's 20 s timeout";
  }
}

TEST(MultiNode, WrongSecretNodeCannotJoin) {
  Orchestrator orch;
  pid_t bad = spawn_node({orch.address(), "2", "secret", "0", "all"}, "wrong");
  auto codes = wait_all({bad}, 60);
  EXPECT_EQ(std::vector<int>({1}), codes);
}

// Hosts with their own addresses: one network namespace per node, joined by a veth
// pair to a bridge in this namespace, which carries the orchestrator's address.

// Two nodes x two devices, each node in its own network namespace with its own
// address; over TCP the data crosses the veth links, by default the processes
// (still one host) find each other and use shared memory.
TEST(MultiNode, NodesInSeparateNetworkNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "creating network namespaces needs root";
  NetnsHosts hosts(2);
  if (!hosts.ok()) GTEST_SKIP() << "this machine cannot create network namespaces and veth links (ip netns add)";
  for (std::string transport : {"tcp", ""}) {
    Orchestrator orch(hosts.host_address());
    std::vector<std::string> logs;
    std::vector<pid_t> pids;
    const char *ids[] = {"0,3", "1,2"};
    for (int k = 0; k < 2; k++) {
      logs.push_back("/tmp/ruccl-test-netns-" + std::to_string(getpid()) + "-" + std::to_string(k) + ".log");
      pids.push_back(spawn_node({orch.address(), "2", "netns", ids[k], "all"}, kSecret, transport, logs[k],
                                hosts.name(k), hosts.address(k)));
    }
    EXPECT_EQ(std::vector<int>({0, 0}), wait_all(pids)) << "transport '" << transport << "'";
    std::string text = read_file(logs[0]) + read_file(logs[1]);
    EXPECT_EQ(transport.empty(), text.find("shared memory with node") != std::string::npos)
        << "transport '" << transport << "': " << text.substr(0, 2000);
    EXPECT_NE(std::string::npos, text.find("node 1: connected to node 0 at " + hosts.address(0) + ":"))
        << "node 1 must reach node 0 at its own namespace's address: " << text.substr(0, 2000);
    if (!getenv("KEEP_LOGS")) for (const auto &l : logs) unlink(l.c_str());
  }
}

// A node that joined and then was cut off (its host gone without a FIN) does not hold
// its group at the orchestrator: its half-open connection is found by keepalive and
// leaves the session, so that two new nodes of the same group meet as if it never
// came (before, the first of them joined the dead node's session and the second was
// refused: "already has a running session").
// Liveness, for a node cut off from the network (its link down: no FIN, no RST, its
// connections half open) in the middle of 32 MB all-reduces between three hosts
// (network namespaces, TCP): every survivor ends with PEER_LOST after the liveness
// timeout (1.5 s here), well before the collectives' own 20 s, and node 2, the cut
// node's successor, names it.
TEST(MultiNode, CutOffNodeIsPeerLostForEverySurvivor) {
  if (geteuid() != 0) GTEST_SKIP() << "creating network namespaces needs root";
  NetnsHosts hosts(3);
  if (!hosts.ok()) GTEST_SKIP() << "this machine cannot create network namespaces and veth links (ip netns add)";
  ScopedEnv liveness("RUCCL_LIVENESS_TIMEOUT_MS", "1500");
  SignalledSession r = disturb_mid_all_reduce("cutoff", "tcp", [&](pid_t) { EXPECT_TRUE(hosts.cut(1)); }, &hosts);
  expect_survivors_lost(r);
  EXPECT_LT(r.took, 15.0) << "the survivors waited for the collectives' timeout";
}

TEST(MultiNode, HalfOpenNodeDoesNotHoldItsGroup) {
  if (geteuid() != 0) GTEST_SKIP() << "creating network namespaces needs root";
  NetnsHosts hosts(1);
  if (!hosts.ok()) GTEST_SKIP() << "this machine cannot create network namespaces and veth links (ip netns add)";
  Orchestrator orch(hosts.host_address());
  std::string log = "/tmp/ruccl-test-halfopen-" + std::to_string(getpid()) + ".log";
  pid_t lost = spawn_node({orch.address(), "2", "halfopen", "0", "all"}, kSecret, "tcp", log, hosts.name(0),
                          hosts.address(0));
  // it has joined, and waits for a second node that is not coming
  std::string text;
  for (int i = 0; i < 200 && text.find("joined group 'halfopen'") == std::string::npos; i++) {
    usleep(50000);
    text = read_file(log);
  }
  ASSERT_NE(std::string::npos, text.find("joined group 'halfopen'")) << "the node never joined: " << text;
  usleep(200000);  // its JOIN is in; the orchestrator admits it
  ASSERT_TRUE(hosts.cut(0));
  sleep(14);  // keepalive: 5 s idle, then 3 probes 2 s apart
  std::vector<pid_t> pids = {spawn_node({orch.address(), "2", "halfopen", "0", "all"}),
                             spawn_node({orch.address(), "2", "halfopen", "1", "all"})};
  EXPECT_EQ(std::vector<int>({0, 0}), wait_all(pids, 90)) << "the cut-off node still held group 'halfopen'";
  kill(lost, SIGKILL);
  wait_all({lost}, 10);
  if (!getenv("KEEP_LOGS")) unlink(log.c_str());
}

// ---- revoke, agree, shrink across nodes (tests/node_recovery.c) ----------------------

// "4x1": four nodes of one peer; "4x2": four of two.
std::vector<std::string> RecoveryLayout(const std::string &layout) {
  if (layout == "4x2") return {"0,1", "2,3", "4,5", "6,7"};
  return {"0", "1", "2", "3"};
}

// Every "peer ID: agreed ..." line of text, by peer id: what follows the id.
std::map<int, std::string> AgreedLines(const std::string &text) {
  std::map<int, std::string> out;
  std::regex line("peer (\\d+): (agreed [0-9a-f]+ failed [0-9,]*)");
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = (*it)[2];
  return out;
}

std::string TailOf(const std::string &text) { return text.substr(text.size() > 4000 ? text.size() - 4000 : 0); }

class Recovery : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// kill -9 of one node while every peer is in an all-reduce: every survivor gets
// PEER_LOST, agrees on the same failed set (the killed node's peers, nobody else),
// shrinks, and an all-reduce over the survivors is right.
TEST_P(Recovery, KilledNodeMidAllReduceIsAgreedShrunkAndTheSurvivorsGoOn) {
  const auto &[transport, layout] = GetParam();
  Orchestrator orch;
  std::vector<std::string> ids = RecoveryLayout(layout);
  LoggedNodes nodes(orch, "rk" + layout + transport, ids, "shrink", "ring", transport);
  unsigned per = layout == "4x2" ? 2 : 1, total = 4 * per;
  auto running = [&] {
    std::string all;
    for (size_t k = 0; k < ids.size(); k++) all += nodes.log(k);
    for (unsigned id = 0; id < total; id++)
      if (all.find("peer " + std::to_string(id) + ": running") == std::string::npos) return false;
    return true;
  };
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(running()) << "the all-reduces never got under way";
  kill(nodes.pids[2], SIGKILL);
  waitpid(nodes.pids[2], nullptr, 0);
  std::vector<int> codes = wait_all({nodes.pids[0], nodes.pids[1], nodes.pids[3]}, 90);
  std::string text = nodes.log(0) + nodes.log(1) + nodes.log(3);
  EXPECT_EQ(std::vector<int>(3, 0), codes) << TailOf(text);
  std::string failed;
  for (unsigned l = 0; l < per; l++) failed += std::to_string(2 * per + l) + ",";
  std::map<int, std::string> agreed = AgreedLines(text);
  EXPECT_EQ(3 * per, agreed.size()) << TailOf(text);
  for (const auto &[id, line] : agreed) {
    EXPECT_EQ(agreed.begin()->second, line) << "peer " << id << " agreed otherwise";
    EXPECT_NE(std::string::npos, line.find("failed " + failed)) << "peer " << id << ": " << line;
    EXPECT_EQ(std::string::npos, line.find("failed " + failed + "0")) << "only the killed node's peers";
  }
  for (unsigned id = 0; id < total; id++) {
    if (id / per == 2) continue;
    EXPECT_NE(std::string::npos, text.find("peer " + std::to_string(id) + ": shrunk to " + std::to_string(3 * per) +
                                           ", right"))
        << "peer " << id;
  }
}

// The coordinator of the agreement (node 0) dies in it, after the first node answered
// and before any decision went out: the others still agree, all alike, that node 0's
// peers failed, and go on without them.
TEST_P(Recovery, CoordinatorThatDiesDuringTheAgreementIsAgreedLost) {
  const auto &[transport, layout] = GetParam();
  Orchestrator orch;
  std::vector<std::string> ids = RecoveryLayout(layout);
  ScopedEnv die("RUCCL_TEST_DIE_IN_AGREE_PEER", "0");
  LoggedNodes nodes(orch, "rd" + layout + transport, ids, "agreedie", "ring", transport);
  std::vector<int> codes = wait_all(nodes.pids, 90);
  std::string text = nodes.log(1) + nodes.log(2) + nodes.log(3);
  EXPECT_EQ((std::vector<int>{9, 0, 0, 0}), codes) << TailOf(text);
  unsigned per = layout == "4x2" ? 2 : 1;
  std::map<int, std::string> agreed = AgreedLines(text);
  EXPECT_EQ(3 * per, agreed.size()) << TailOf(text);
  for (const auto &[id, line] : agreed) {
    EXPECT_EQ(agreed.begin()->second, line) << "peer " << id << " agreed otherwise";
    EXPECT_NE(std::string::npos, line.find(per == 2 ? "failed 0,1," : "failed 0,")) << line;
    EXPECT_EQ(std::string::npos, line.find(per == 2 ? "failed 0,1,2" : "failed 0,1")) << line;
  }
}

// The coordinator dies right after it sent the decision to the first node it asked
// (node 1): the others never get it from it, yet they end with node 1's decision, not
// a timeout nor another one.
TEST_P(Recovery, CoordinatorThatDiesWhileSendingTheDecisionLeavesOneDecision) {
  const auto &[transport, layout] = GetParam();
  Orchestrator orch;
  std::vector<std::string> ids = RecoveryLayout(layout);
  ScopedEnv die("RUCCL_TEST_DIE_IN_AGREE_PEER", "0");
  ScopedEnv mode("RUCCL_TEST_DIE_IN_AGREE_MODE", "2");
  LoggedNodes nodes(orch, "rs" + layout + transport, ids, "agreedie", "ring", transport);
  std::vector<int> codes = wait_all(nodes.pids, 90);
  std::string text = nodes.log(1) + nodes.log(2) + nodes.log(3);
  EXPECT_EQ(9, codes[0]);
  std::map<int, std::string> agreed = AgreedLines(text);
  unsigned per = layout == "4x2" ? 2 : 1;
  ASSERT_EQ(3 * per, agreed.size()) << TailOf(text);
  for (const auto &[id, line] : agreed) {
    EXPECT_EQ(agreed.begin()->second, line) << "peer " << id << " agreed otherwise";
    // node 1 kept the decision node 0 made with everyone alive: nobody failed
    EXPECT_EQ("failed ", line.substr(line.size() - 7)) << line;
  }
}

INSTANTIATE_TEST_SUITE_P(MultiNode, Recovery,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values("4x1", "4x2")),
                         [](const auto &info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// Four nodes run a recovery scenario (tests/node_recovery.c) to the end: every node's
// exit code (0: its checks passed) and their logs.
struct ScenarioRun {
  std::vector<int> codes;
  std::string text;
};
ScenarioRun RunScenario(const std::string &group, const std::string &scenario, const std::string &layout,
                        const std::string &transport, int limit_s) {
  Orchestrator orch;
  LoggedNodes nodes(orch, group, RecoveryLayout(layout), scenario, "ring", transport);
  ScenarioRun r;
  r.codes = wait_all(nodes.pids, limit_s);
  for (size_t k = 0; k < nodes.logs.size(); k++) r.text += nodes.log(k);
  return r;
}

// A thread of peer 1 revokes 64 MB all-reduces at varying points: every peer sees
// REVOKED (in the all-reduce, or in the barrier after it), agrees that nobody failed,
// shrinks to the same four peers and goes on with the new communicator, round after
// round.
TEST_P(Transports, RevokeRacing64MBAllReducesThenShrinkGoesOn) {
  ScenarioRun r = RunScenario("rrv" + GetParam(), "revoke", "4x1", GetParam(), 240);
  EXPECT_EQ(std::vector<int>(4, 0), r.codes) << TailOf(r.text);
}

// Exclude lists that leave out different nodes: every caller gets INVALID_ARGUMENT,
// the node that one list leaves out included (it takes part with its own list).
TEST(MultiNode, ExcludeListsThatDifferBetweenNodesAreInvalidEverywhere) {
  ScenarioRun r = RunScenario("rxm", "xmismatch", "4x1", "", 90);
  EXPECT_EQ(std::vector<int>(4, 0), r.codes) << TailOf(r.text);
}

TEST(MultiNode, RevokeOfOneCommunicatorLeavesAnotherOnTheSameNodesAlone) {
  ScenarioRun r = RunScenario("rr2", "revoke2", "4x1", "", 60);
  EXPECT_EQ(std::vector<int>(4, 0), r.codes) << TailOf(r.text);
}

TEST(MultiNode, ShrinkWithAnExcludeListAndNoFailure) {
  for (const std::string layout : {"4x1", "4x2"}) {
    ScenarioRun r = RunScenario("rx" + layout, "exclude", layout, "", 60);
    EXPECT_EQ(std::vector<int>(4, 0), r.codes) << layout << ": " << TailOf(r.text);
    unsigned per = layout == "4x2" ? 2 : 1;
    for (unsigned id = 0; id < 3 * per; id++)
      EXPECT_NE(std::string::npos, r.text.find("peer " + std::to_string(id) + ": shrunk to " +
                                               std::to_string(3 * per) + ", right"))
          << layout << ": peer " << id;
  }
}

}  // namespace
