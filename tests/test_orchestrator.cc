// test_orchestrator.cc — the multi-node rendezvous server over real sockets on
// 127.0.0.1: start/port/stop, a port in use, authentication, garbage and oversized
// frames, and sessions (table, duplicate ids, configuration mismatch, a new
// session after the old one left, an unreachable orchestrator).
#include <arpa/inet.h>
#include <dirent.h>
#include <malloc.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// the sanitizer runtime's own count (its header is not always installed)
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "net/bootstrap.h"
#include "net/wire.h"
#include "ruccl.h"
#include "transport.h"
}

namespace {

const char kSecret[] = "orchestrator-test-secret";

struct Orchestrator {
  ruccl_orchestrator_t *o = nullptr;
  explicit Orchestrator(const char *secret = kSecret) {
    EXPECT_EQ(RUCCL_OK, ruccl_orchestrator_start("127.0.0.1:0", secret, strlen(secret), &o)) << ruccl_last_error();
  }
  ~Orchestrator() {
    if (o) {
      EXPECT_EQ(RUCCL_OK, ruccl_orchestrator_stop(o));
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(ruccl_orchestrator_port(o)); }
};

int64_t in_ms(int64_t ms) { return ruccl_now_ns() + ms * 1000000; }

struct Key {  // the handshake key of a secret
  unsigned char k[RUCCL_AUTH_KEY_BYTES];
  explicit Key(const char *secret) { EXPECT_EQ(RUCCL_OK, ruccl_auth_key(secret, strlen(secret), k)); }
};

ruccl_join_t make_join(const char *group, uint32_t num_nodes, std::vector<uint32_t> ids, uint32_t port,
                       unsigned char digest_byte = 7) {
  ruccl_join_t j;
  memset(&j, 0, sizeof j);
  snprintf(j.group, sizeof j.group, "%s", group);
  j.num_nodes = num_nodes;
  memset(j.digest, digest_byte, sizeof j.digest);
  snprintf(j.address, sizeof j.address, "127.0.0.1");
  j.data_port = port;
  j.num_local = (uint32_t)ids.size();
  for (size_t i = 0; i < ids.size(); i++) j.peer_ids[i] = ids[i];
  return j;
}

struct JoinResult {
  ruccl_result_t rc = RUCCL_ERR_PROTOCOL;
  int fd = -1;
  ruccl_table_t table{};
  std::string error;
};

JoinResult join(const std::string &addr, const ruccl_join_t &j, const char *secret = kSecret, int64_t ms = 5000) {
  JoinResult r;
  r.rc = ruccl_bootstrap_join(addr.c_str(), Key(secret).k, &j, in_ms(ms), &r.fd, &r.table);
  r.error = ruccl_last_error();
  return r;
}

int raw_connect(int port) {
  int fd = -1;
  EXPECT_EQ(RUCCL_OK, ruccl_tcp_connect("127.0.0.1", port, in_ms(2000), &fd));
  return fd;
}

// A full, successful two-node session: the orchestrator is still healthy.
void expect_two_node_session(const Orchestrator &orch, const char *group) {
  JoinResult a, b;
  std::thread ta([&] { a = join(orch.address(), make_join(group, 2, {5, 1}, 1111)); });
  std::thread tb([&] { b = join(orch.address(), make_join(group, 2, {0, 9}, 2222)); });
  ta.join();
  tb.join();
  ASSERT_EQ(RUCCL_OK, a.rc) << a.error;
  ASSERT_EQ(RUCCL_OK, b.rc) << b.error;
  for (JoinResult *r : {&a, &b}) {
    ASSERT_EQ(2u, r->table.num_nodes);
    // sorted by smallest peer id: node {0, 9} first
    EXPECT_EQ(2222u, r->table.nodes[0].data_port);
    EXPECT_EQ(1111u, r->table.nodes[1].data_port);
    EXPECT_EQ(2u, r->table.nodes[1].num_local);
    EXPECT_EQ(5u, r->table.nodes[1].peer_ids[0]);
    ruccl_table_free(&r->table);
    ruccl_bootstrap_leave(r->fd);
  }
}

TEST(Orchestrator, StartsOnAnyPortAndStops) {
  Orchestrator orch;
  ASSERT_NE(nullptr, orch.o);
  EXPECT_GT(ruccl_orchestrator_port(orch.o), 0);
}

TEST(Orchestrator, BadArguments) {
  ruccl_orchestrator_t *o = nullptr;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_orchestrator_start(nullptr, "", 0, &o));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_orchestrator_start("127.0.0.1:0", "", 0, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_orchestrator_start("no-port", "", 0, &o));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_orchestrator_start("127.0.0.1:99999", "", 0, &o));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_orchestrator_stop(nullptr));
  EXPECT_EQ(-1, ruccl_orchestrator_port(nullptr));
}

TEST(Orchestrator, PortInUseIsAnIoError) {
  Orchestrator first;
  std::string addr = first.address();
  ruccl_orchestrator_t *second = nullptr;
  EXPECT_EQ(RUCCL_ERR_IO, ruccl_orchestrator_start(addr.c_str(), kSecret, strlen(kSecret), &second));
  EXPECT_EQ(nullptr, second);
  EXPECT_NE(nullptr, strstr(ruccl_last_error(), "Address already in use")) << ruccl_last_error();
}

TEST(Orchestrator, SessionGivesEveryNodeTheTableAndCanStartAgain) {
  Orchestrator orch;
  expect_two_node_session(orch, "again");
  expect_two_node_session(orch, "again");  // the first session left: the name is free
}

TEST(Orchestrator, WrongSecretIsRefusedAndTheSessionGoesOn) {
  Orchestrator orch;
  JoinResult bad = join(orch.address(), make_join("auth", 2, {0}, 1000), "not-the-secret");
  EXPECT_EQ(RUCCL_ERR_AUTH, bad.rc) << bad.error;
  expect_two_node_session(orch, "auth");
}

TEST(Orchestrator, ClientDetectsAnImpostorServer) {
  Orchestrator impostor("some-other-secret");
  JoinResult r = join(impostor.address(), make_join("impostor", 1, {0}, 1000));
  EXPECT_EQ(RUCCL_ERR_AUTH, r.rc) << r.error;
}

TEST(Orchestrator, GarbageTruncatedAndOversizedFramesAreDropped) {
  Orchestrator orch;
  int port = ruccl_orchestrator_port(orch.o);
  {  // plain garbage instead of an authentication frame
    int fd = raw_connect(port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(RUCCL_OK, ruccl_write_all(fd, junk, sizeof junk, in_ms(1000)));
    char buf[256];
    uint16_t type;
    uint32_t len;
    ruccl_frame_recv(fd, &type, buf, sizeof buf, &len, in_ms(2000));  // the HELLO
    // the server closes on the bad frame: reading reaches the end
    EXPECT_EQ(RUCCL_ERR_PEER_LOST, ruccl_read_all(fd, buf, 1, in_ms(3000)));
    close(fd);
  }
  {  // a header announcing a 3 GB payload: refused without allocating it
    int fd = raw_connect(port);
    unsigned char h[RUCCL_FRAME_HEADER_BYTES];
    ruccl_frame_header_encode(RUCCL_FRAME_AUTH, 3000000000u, h);
    ASSERT_EQ(RUCCL_OK, ruccl_write_all(fd, h, sizeof h, in_ms(1000)));
    char buf[256];
    uint16_t type;
    uint32_t len;
    ruccl_frame_recv(fd, &type, buf, sizeof buf, &len, in_ms(2000));
    EXPECT_EQ(RUCCL_ERR_PEER_LOST, ruccl_read_all(fd, buf, 1, in_ms(3000)));
    close(fd);
  }
  {  // a truncated header, then the connection closes
    int fd = raw_connect(port);
    ASSERT_EQ(RUCCL_OK, ruccl_write_all(fd, "RU", 2, in_ms(1000)));
    close(fd);
  }
  {  // authenticated, with a malformed JOIN
    int fd = raw_connect(port);
    unsigned char bogus[40] = {1, 2, 3};
    ASSERT_EQ(RUCCL_OK, ruccl_auth_client(fd, Key(kSecret).k, RUCCL_FRAME_JOIN, bogus, sizeof bogus, in_ms(2000)));
    char buf[16];
    EXPECT_EQ(RUCCL_ERR_PEER_LOST, ruccl_read_all(fd, buf, 1, in_ms(3000)));
    close(fd);
  }
  expect_two_node_session(orch, "after-garbage");
}

// A raw frame: its type and payload (read whole, or type 0 when the connection
// ended or timed out).
struct Frame {
  uint16_t type = 0;
  std::vector<unsigned char> payload;
};
Frame read_frame(int fd, int64_t ms = 2000) {
  Frame f;
  std::vector<unsigned char> buf(RUCCL_WIRE_MAX_CONTROL);
  uint32_t len = 0;
  if (ruccl_frame_recv(fd, &f.type, buf.data(), (uint32_t)buf.size(), &len, in_ms(ms)) != RUCCL_OK) return Frame{};
  f.payload.assign(buf.begin(), buf.begin() + len);
  return f;
}

// The AUTH frame a real client under `secret` answers a HELLO payload with, taken
// through a socket pair (a man in the middle, or an impostor server); the client is
// then cut off.
Frame client_auth(const std::vector<unsigned char> &hello, const char *secret, const void *first, uint32_t len) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) return Frame{};
  std::thread client([&] { ruccl_auth_client(sp[1], Key(secret).k, RUCCL_FRAME_JOIN, first, len, in_ms(3000)); });
  Frame auth;
  if (ruccl_frame_send(sp[0], RUCCL_FRAME_HELLO, hello.data(), (uint32_t)hello.size(), in_ms(1000)) == RUCCL_OK)
    auth = read_frame(sp[0]);
  shutdown(sp[0], SHUT_RDWR);
  client.join();
  close(sp[0]);
  close(sp[1]);
  return auth;
}

// A stranger that stops at each step of the handshake, or lies at it, leaves the
// orchestrator serving: nothing it sends is taken before a valid proof.
TEST(Handshake, AStrangerAtEachStepIsDroppedAndTheSessionGoesOn) {
  Orchestrator orch;
  int port = ruccl_orchestrator_port(orch.o);
  for (int step = 0; step < 6; step++) {
    int fd = raw_connect(port);
    Frame hello = step > 0 ? read_frame(fd) : Frame{};
    if (step > 0) {
      EXPECT_EQ(RUCCL_FRAME_HELLO, hello.type);
      EXPECT_EQ(4u + RUCCL_PAKE_SHARE_BYTES, hello.payload.size()) << "version and the server's share";
    }
    std::vector<unsigned char> auth(RUCCL_AUTH_HEAD_BYTES, 0xab);  // a share, a proof, a type
    if (step == 3) {  // a share that is a point of the curve (a real client's), a made-up proof
      ruccl_pake_t p;
      ASSERT_EQ(RUCCL_OK, ruccl_pake_start(Key(kSecret).k, RUCCL_PAKE_CLIENT, &p));
      memcpy(auth.data(), p.share, RUCCL_PAKE_SHARE_BYTES);
    }
    if (step == 2) {  // half an AUTH frame, then gone
      unsigned char h[RUCCL_FRAME_HEADER_BYTES];
      ruccl_frame_header_encode(RUCCL_FRAME_AUTH, RUCCL_AUTH_HEAD_BYTES, h);
      ruccl_write_all(fd, h, sizeof h, in_ms(1000));
      ruccl_write_all(fd, auth.data(), 20, in_ms(1000));
    }
    if (step == 3) {  // a made-up proof: refused (AUTH_FAIL), never answered with a proof
      ASSERT_EQ(RUCCL_OK, ruccl_frame_send(fd, RUCCL_FRAME_AUTH, auth.data(), (uint32_t)auth.size(), in_ms(1000)));
      EXPECT_EQ(RUCCL_FRAME_AUTH_FAIL, read_frame(fd).type);
    }
    if (step == 4) {  // shorter than a share and a proof
      ASSERT_EQ(RUCCL_OK, ruccl_frame_send(fd, RUCCL_FRAME_AUTH, auth.data(), 40, in_ms(1000)));
      EXPECT_EQ(0, read_frame(fd).type) << "closed without an answer";
    }
    if (step == 5) {  // another frame instead of AUTH (a JOIN before the proof)
      ruccl_join_t j = make_join("stranger", 1, {0}, 1000);
      ASSERT_EQ(RUCCL_OK, ruccl_frame_send(fd, RUCCL_FRAME_JOIN, &j, 64, in_ms(1000)));
      EXPECT_EQ(0, read_frame(fd).type) << "closed without an answer";
    }
    close(fd);
  }
  expect_two_node_session(orch, "after-strangers");
}

// A proof holds for one handshake only: an AUTH frame a node sent for one nonce,
// relayed by a man in the middle into another connection, is refused; relayed into
// the connection whose nonce it answers, it is what the node said (the JOIN inside
// it, group and all, cannot be changed without breaking the proof).
TEST(Handshake, AReplayedOrAlteredProofIsRefused) {
  Orchestrator orch;
  int port = ruccl_orchestrator_port(orch.o);
  int first = raw_connect(port), second = raw_connect(port);
  Frame hello1 = read_frame(first), hello2 = read_frame(second);
  ASSERT_EQ(RUCCL_FRAME_HELLO, hello1.type);
  ASSERT_EQ(RUCCL_FRAME_HELLO, hello2.type);
  EXPECT_NE(hello1.payload, hello2.payload) << "every connection gets a fresh nonce";

  // A real client answers hello1 through a socket pair (the man in the middle).
  ruccl_join_t j = make_join("relay", 1, {0}, 1000);
  size_t jlen = 0;
  unsigned char *wire = ruccl_join_encode(&j, &jlen);
  ASSERT_NE(nullptr, wire);
  Frame auth = client_auth(hello1.payload, kSecret, wire, (uint32_t)jlen);
  free(wire);
  ASSERT_EQ(RUCCL_FRAME_AUTH, auth.type);

  // Replayed into the second connection (another nonce): refused.
  ASSERT_EQ(RUCCL_OK, ruccl_frame_send(second, auth.type, auth.payload.data(), (uint32_t)auth.payload.size(), in_ms(1000)));
  EXPECT_EQ(RUCCL_FRAME_AUTH_FAIL, read_frame(second).type);
  close(second);

  // Altered (another group name in the JOIN it carries) into the first: refused.
  int third = raw_connect(port);
  Frame hello3 = read_frame(third);
  (void)hello3;
  std::vector<unsigned char> altered = auth.payload;
  altered[RUCCL_AUTH_HEAD_BYTES] ^= 1;  // the JOIN's first byte: its group name
  ASSERT_EQ(RUCCL_OK, ruccl_frame_send(first, auth.type, altered.data(), (uint32_t)altered.size(), in_ms(1000)));
  EXPECT_EQ(RUCCL_FRAME_AUTH_FAIL, read_frame(first).type);
  close(first);

  // The untouched frame answers nothing but its own nonce: on a third connection it fails too.
  ASSERT_EQ(RUCCL_OK, ruccl_frame_send(third, auth.type, auth.payload.data(), (uint32_t)auth.payload.size(), in_ms(1000)));
  EXPECT_EQ(RUCCL_FRAME_AUTH_FAIL, read_frame(third).type);
  close(third);
  expect_two_node_session(orch, "after-replay");
}

// The server proves itself only after the client has: a client with a wrong secret
// gets AUTH_FAIL and no proof of the server's to guess the secret from.
TEST(Handshake, TheServerRevealsNoProofToAClientThatHasNotProvenItself) {
  Orchestrator orch;
  int fd = raw_connect(ruccl_orchestrator_port(orch.o));
  Frame hello = read_frame(fd);
  ASSERT_EQ(RUCCL_FRAME_HELLO, hello.type);
  // a well-formed AUTH under another key, through a socket pair as before
  Frame auth = client_auth(hello.payload, "guess", "x", 1);
  ASSERT_EQ(RUCCL_FRAME_AUTH, auth.type);
  ASSERT_EQ(RUCCL_OK, ruccl_frame_send(fd, auth.type, auth.payload.data(), (uint32_t)auth.payload.size(), in_ms(1000)));
  Frame answer = read_frame(fd);
  EXPECT_EQ(RUCCL_FRAME_AUTH_FAIL, answer.type);
  EXPECT_TRUE(answer.payload.empty()) << "AUTH_FAIL carries nothing";
  EXPECT_EQ(0, read_frame(fd, 1000).type) << "and the connection ends";
  close(fd);
}

// What an impostor server learns: it answers a real client with a HELLO made under
// its own guess of the secret, takes the client's AUTH, and then, offline, tries
// every candidate secret with everything it knows (its own scalar included) the way
// a server checks a proof.  None of the candidates verifies, not even the true
// secret: the exchange gave it one online guess (its own, wrong) and nothing to
// test a dictionary against.  Had it guessed right, the same check passes.
TEST(Handshake, AnImpostorServerCannotTestGuessesOffline) {
  for (const char *impostor_guess : {"password", kSecret}) {
    ruccl_auth_server_t impostor;
    ASSERT_EQ(RUCCL_OK, ruccl_auth_hello(Key(impostor_guess).k, &impostor));
    Frame auth = client_auth({impostor.hello, impostor.hello + sizeof impostor.hello}, kSecret, "join", 4);
    ASSERT_EQ(RUCCL_FRAME_AUTH, auth.type);
    ASSERT_EQ(RUCCL_AUTH_HEAD_BYTES + 4u, auth.payload.size());
    int verified = 0;
    for (const char *candidate : {"123456", "password", "letmein", kSecret, "orchestrator-test-secre"}) {
      ruccl_auth_server_t state = impostor;  // its scalar, as an attacker keeps it
      uint16_t type = 0;
      const unsigned char *first = nullptr;
      uint32_t len = 0;
      unsigned char proof[RUCCL_AUTH_PROOF_BYTES];
      ruccl_result_t rc = ruccl_auth_check(Key(candidate).k, &state, auth.payload.data(),
                                           (uint32_t)auth.payload.size(), &type, &first, &len, proof);
      if (rc == RUCCL_OK) {
        verified++;
        EXPECT_STREQ(kSecret, candidate);
        EXPECT_EQ(RUCCL_FRAME_JOIN, type);
        EXPECT_EQ(0, memcmp(first, "join", 4));
      } else {
        EXPECT_EQ(RUCCL_ERR_AUTH, rc) << candidate;
      }
    }
    if (strcmp(impostor_guess, kSecret) == 0)
      EXPECT_EQ(1, verified) << "a right online guess is a server that knows the secret";
    else
      EXPECT_EQ(0, verified) << "the true secret verified offline against a wrong guess's exchange";
  }
}

// The key exchange itself: both sides with the key end with the same secret, fresh
// for every exchange; a side with another key ends with another; a share that is
// not a point of the curve is refused.
TEST(Handshake, TheKeyExchangeAgreesOnlyWithTheKeyAndRefusesNonPoints) {
  unsigned char a[RUCCL_PAKE_SECRET_BYTES], b[RUCCL_PAKE_SECRET_BYTES], last[RUCCL_PAKE_SECRET_BYTES] = {};
  for (int round = 0; round < 2; round++) {
    ruccl_pake_t c, s;
    ASSERT_EQ(RUCCL_OK, ruccl_pake_start(Key(kSecret).k, RUCCL_PAKE_CLIENT, &c));
    ASSERT_EQ(RUCCL_OK, ruccl_pake_start(Key(kSecret).k, RUCCL_PAKE_SERVER, &s));
    EXPECT_NE(0, memcmp(c.share, s.share, RUCCL_PAKE_SHARE_BYTES));
    ASSERT_EQ(RUCCL_OK, ruccl_pake_finish(Key(kSecret).k, &c, s.share, a));
    ASSERT_EQ(RUCCL_OK, ruccl_pake_finish(Key(kSecret).k, &s, c.share, b));
    EXPECT_EQ(0, memcmp(a, b, sizeof a)) << "round " << round;
    EXPECT_NE(0, memcmp(a, last, sizeof a)) << "the same secret twice";
    memcpy(last, a, sizeof a);
    ASSERT_EQ(RUCCL_OK, ruccl_pake_finish(Key("other").k, &s, c.share, b));
    EXPECT_NE(0, memcmp(a, b, sizeof a)) << "another key reached the same secret";

    unsigned char bad[RUCCL_PAKE_SHARE_BYTES];
    memcpy(bad, c.share, sizeof bad);
    bad[RUCCL_PAKE_SHARE_BYTES - 1] ^= 1;  // y no longer fits x
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_pake_finish(Key(kSecret).k, &s, bad, b));
    memset(bad, 0, sizeof bad);  // not an encoding of a point at all
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_pake_finish(Key(kSecret).k, &s, bad, b));
    bad[0] = 4;  // (0, 0): uncompressed, off the curve
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_pake_finish(Key(kSecret).k, &s, bad, b));
    ruccl_pake_wipe(&c);
    for (unsigned char byte : c.scalar) EXPECT_EQ(0, byte);
    ruccl_pake_wipe(&s);
  }
}

int threads_of_this_process() {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  while (struct dirent *e = readdir(d))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

// Unauthenticated load: 1000 connections that say nothing and 200 that send garbage
// (junk, a bad proof, half a frame) cost the orchestrator a socket each, never a
// thread, and a real session beside them runs as it does alone.
TEST(Orchestrator, ThousandIdleAndTwoHundredGarbageConnectionsLeaveASessionAlone) {
  struct rlimit rl;
  ASSERT_EQ(0, getrlimit(RLIMIT_NOFILE, &rl));
  if (rl.rlim_cur < 4096 && rl.rlim_max > rl.rlim_cur) {
    rl.rlim_cur = rl.rlim_max < 8192 ? rl.rlim_max : 8192;
    ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &rl));
  }
  ASSERT_GE(rl.rlim_cur, 2600u) << "this test needs 2600 descriptors (both ends of 1200 connections)";
  Orchestrator orch;
  int port = ruccl_orchestrator_port(orch.o);
  int threads_before = threads_of_this_process();
  std::vector<int> fds;
  for (int i = 0; i < 1000; i++) fds.push_back(raw_connect(port));
  for (int i = 0; i < 200; i++) {
    int fd = raw_connect(port);
    fds.push_back(fd);
    if (i % 3 == 0) {
      const char junk[] = "GET / HTTP/1.1\r\n\r\n";
      ruccl_write_all(fd, junk, sizeof junk, in_ms(1000));
    } else if (i % 3 == 1) {
      std::vector<unsigned char> auth(RUCCL_AUTH_HEAD_BYTES + 8, 0x5a);
      ruccl_frame_send(fd, RUCCL_FRAME_AUTH, auth.data(), (uint32_t)auth.size(), in_ms(1000));
    } else {
      unsigned char h[RUCCL_FRAME_HEADER_BYTES];
      ruccl_frame_header_encode(RUCCL_FRAME_AUTH, 1000, h);
      ruccl_write_all(fd, h, sizeof h, in_ms(1000));
    }
  }
  for (int fd : fds) ASSERT_GE(fd, 0);
  usleep(200 * 1000);
  EXPECT_LE(threads_of_this_process(), threads_before) << "a stranger got a thread";
  auto t0 = std::chrono::steady_clock::now();
  expect_two_node_session(orch, "beside-strangers");
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 2.0) << "the session waited behind the strangers";
  for (int fd : fds) close(fd);
  expect_two_node_session(orch, "after-strangers");
}

// Bytes this process holds from the heap, as its allocator counts them (the
// sanitizers' allocators under ASan/TSan, glibc's otherwise).
size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

// A stranger's AUTH header may announce 64 KB: the orchestrator's buffer grows with
// what arrives, so 500 strangers that announce 64 KB and send 100 bytes cost it a
// few hundred KB, not 32 MB, and a session beside them goes on.
TEST(Orchestrator, StrangersThatAnnounceLargeFramesCostWhatTheySend) {
  Orchestrator orch;
  int port = ruccl_orchestrator_port(orch.o);
  std::vector<int> fds;
  size_t before = heap_in_use();
  std::vector<unsigned char> some(100, 0x5a);
  for (int i = 0; i < 500; i++) {
    int fd = raw_connect(port);
    fds.push_back(fd);
    unsigned char h[RUCCL_FRAME_HEADER_BYTES];
    ruccl_frame_header_encode(RUCCL_FRAME_AUTH, RUCCL_WIRE_MAX_CONTROL, h);
    ASSERT_EQ(RUCCL_OK, ruccl_write_all(fd, h, sizeof h, in_ms(1000)));
    ASSERT_EQ(RUCCL_OK, ruccl_write_all(fd, some.data(), some.size(), in_ms(1000)));
  }
  for (int fd : fds) EXPECT_EQ(RUCCL_FRAME_HELLO, read_frame(fd).type);  // each one is being served
  usleep(300 * 1000);
  size_t after = heap_in_use();
  EXPECT_LT(after, before + 8u * 1024 * 1024)
      << "500 pending handshakes hold " << (after - before) / 1024 << " KB";
  expect_two_node_session(orch, "beside-large-announcements");
  for (int fd : fds) close(fd);
}

TEST(Orchestrator, DuplicatePeerIdAcrossNodesIsRefused) {
  Orchestrator orch;
  JoinResult first, dup;
  std::thread t1([&] { first = join(orch.address(), make_join("dup", 2, {0, 1}, 1000), kSecret, 1500); });
  usleep(200 * 1000);
  dup = join(orch.address(), make_join("dup", 2, {1, 2}, 2000));
  EXPECT_EQ(RUCCL_ERR_DUPLICATE_REGISTRATION, dup.rc) << dup.error;
  // the first node is still waiting for a proper second node
  JoinResult second = join(orch.address(), make_join("dup", 2, {2, 3}, 3000));
  t1.join();
  ASSERT_EQ(RUCCL_OK, first.rc) << first.error;
  ASSERT_EQ(RUCCL_OK, second.rc) << second.error;
  for (JoinResult *r : {&first, &second}) {
    ruccl_table_free(&r->table);
    ruccl_bootstrap_leave(r->fd);
  }
}

TEST(Orchestrator, ConfigurationMismatchFailsEveryWaitingNode) {
  Orchestrator orch;
  JoinResult a, b;
  std::thread ta([&] { a = join(orch.address(), make_join("mismatch", 3, {0}, 1000, 1)); });
  usleep(200 * 1000);
  b = join(orch.address(), make_join("mismatch", 3, {1}, 2000, 2));
  ta.join();
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, a.rc) << a.error;
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, b.rc) << b.error;
}

TEST(Orchestrator, MissingNodesTimeOut) {
  Orchestrator orch;
  int64_t t0 = ruccl_now_ns();
  JoinResult r = join(orch.address(), make_join("alone", 2, {0}, 1000), kSecret, 300);
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, r.rc) << r.error;
  EXPECT_LT(ruccl_now_ns() - t0, 3000LL * 1000000);
}

// A node that gave up waiting (closed its connection) leaves the pending session: the
// next two nodes of the group meet without it.
TEST(Orchestrator, ANodeThatGaveUpIsNotInTheNextTable) {
  Orchestrator orch;
  JoinResult early = join(orch.address(), make_join("gaveup", 2, {7}, 1000), kSecret, 300);
  ASSERT_EQ(RUCCL_ERR_TIMEOUT, early.rc) << early.error;
  usleep(100000);  // its connection's end reaches the orchestrator
  JoinResult a, b;
  std::thread ta([&] { a = join(orch.address(), make_join("gaveup", 2, {1}, 2001)); });
  std::thread tb([&] { b = join(orch.address(), make_join("gaveup", 2, {2}, 2002)); });
  ta.join();
  tb.join();
  for (JoinResult *r : {&a, &b}) {
    ASSERT_EQ(RUCCL_OK, r->rc) << r->error;
    ASSERT_EQ(2u, r->table.num_nodes);
    EXPECT_EQ(2001u, r->table.nodes[0].data_port);
    EXPECT_EQ(2002u, r->table.nodes[1].data_port);
    ruccl_table_free(&r->table);
    ruccl_bootstrap_leave(r->fd);
  }
}

TEST(Orchestrator, UnreachableOrchestratorTimesOut) {
  int port;
  {
    Orchestrator gone;  // find a port that was free, then free it again
    port = ruccl_orchestrator_port(gone.o);
  }
  int64_t t0 = ruccl_now_ns();
  JoinResult r = join("127.0.0.1:" + std::to_string(port), make_join("nobody", 2, {0}, 1000), kSecret, 300);
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, r.rc) << r.error;
  EXPECT_LT(ruccl_now_ns() - t0, 3000LL * 1000000);
}

// A table larger than one control frame: RUCCL_WIRE_MAX_NODES nodes of 1 to 5 local
// peers, in chunks of at most a control frame, decoded back field for field.
TEST(TableWire, ChunksCarryAnyTableSize) {
  const uint32_t n = RUCCL_WIRE_MAX_NODES;
  std::vector<ruccl_join_t> nodes(n);
  for (uint32_t i = 0; i < n; i++) {
    std::vector<uint32_t> ids;
    for (uint32_t k = 0; k <= i % 5; k++) ids.push_back(i * 8 + k);
    nodes[i] = make_join("big", n, ids, 1000 + i);
  }
  ruccl_table_t t = {n, nodes.data()};
  ruccl_table_t back{};
  uint32_t filled = 0, chunks = 0;
  for (uint32_t first = 0; first < n; chunks++) {
    size_t len = 0;
    uint32_t next = 0;
    unsigned char *wire = ruccl_table_encode_chunk(&t, first, RUCCL_WIRE_MAX_CONTROL, &next, &len);
    ASSERT_NE(nullptr, wire);
    ASSERT_LE(len, (size_t)RUCCL_WIRE_MAX_CONTROL);
    ASSERT_GT(next, first);
    ASSERT_EQ(RUCCL_OK, ruccl_table_decode_chunk(wire, len, &back, &filled)) << ruccl_last_error();
    free(wire);
    EXPECT_EQ(next, filled);
    first = next;
  }
  EXPECT_GT(chunks, 20u);  // about 370 bytes a node: some 175 nodes a chunk
  ASSERT_EQ(n, back.num_nodes);
  for (uint32_t i = 0; i < n; i++) {
    ASSERT_EQ(1000 + i, back.nodes[i].data_port) << i;
    ASSERT_EQ(i % 5 + 1, back.nodes[i].num_local) << i;
    ASSERT_EQ(i * 8 + i % 5, back.nodes[i].peer_ids[i % 5]) << i;
    ASSERT_STREQ("big", back.nodes[i].group);
  }
  ruccl_table_free(&back);
}

// A node of RUCCL_WIRE_MAX_LOCAL peers fills a chunk alone; a chunk too small for one
// node is no chunk.
TEST(TableWire, OneLargeNodeFitsAChunkAndTooSmallAChunkIsRefused) {
  std::vector<uint32_t> ids(RUCCL_WIRE_MAX_LOCAL);
  for (uint32_t k = 0; k < ids.size(); k++) ids[k] = k;
  std::vector<ruccl_join_t> nodes = {make_join("wide", 2, ids, 1), make_join("wide", 2, {5000}, 2)};
  ruccl_table_t t = {2, nodes.data()};
  size_t len = 0;
  uint32_t next = 0;
  unsigned char *wire = ruccl_table_encode_chunk(&t, 0, RUCCL_WIRE_MAX_CONTROL, &next, &len);
  ASSERT_NE(nullptr, wire);
  EXPECT_EQ(2u, next);  // both fit one frame
  free(wire);
  EXPECT_EQ(nullptr, ruccl_table_encode_chunk(&t, 0, 100, &next, &len));
  wire = ruccl_table_encode_chunk(&t, 0, 4 * RUCCL_WIRE_MAX_LOCAL + 500, &next, &len);
  ASSERT_NE(nullptr, wire);
  EXPECT_EQ(1u, next);  // the wide node alone
  free(wire);
}

// Chunks out of order, for another table size, truncated, padded or empty are
// PROTOCOL errors that free what was decoded so far.
TEST(TableWire, BadChunksAreProtocolErrors) {
  std::vector<ruccl_join_t> nodes;
  for (uint32_t i = 0; i < 4; i++) nodes.push_back(make_join("bad", 4, {i}, 100 + i));
  ruccl_table_t t = {4, nodes.data()};
  auto chunk = [&](uint32_t first, size_t nodes_in_it) {
    size_t len = 0;
    uint32_t next = 0;
    size_t one = 0;
    unsigned char *probe = ruccl_table_encode_chunk(&t, 0, RUCCL_WIRE_MAX_CONTROL, &next, &one);
    free(probe);
    one = (one - RUCCL_TABLE_CHUNK_HEAD) / 4;  // bytes per node here
    unsigned char *w = ruccl_table_encode_chunk(&t, first, RUCCL_TABLE_CHUNK_HEAD + nodes_in_it * one, &next, &len);
    EXPECT_NE(nullptr, w);
    EXPECT_EQ(first + nodes_in_it, next);
    std::vector<unsigned char> bytes(w, w + len);
    free(w);
    return bytes;
  };
  auto decode = [](std::vector<unsigned char> b, ruccl_table_t *into, uint32_t *filled) {
    return ruccl_table_decode_chunk(b.data(), b.size(), into, filled);
  };
  std::vector<unsigned char> c0 = chunk(0, 2), c2 = chunk(2, 2);
  {
    ruccl_table_t back{};
    uint32_t filled = 0;
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, decode(c2, &back, &filled));  // does not start at 0
    EXPECT_EQ(nullptr, back.nodes);
  }
  {
    ruccl_table_t back{};
    uint32_t filled = 0;
    ASSERT_EQ(RUCCL_OK, decode(c0, &back, &filled));
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, decode(c0, &back, &filled));  // the same chunk again
    EXPECT_EQ(nullptr, back.nodes);
  }
  {
    ruccl_table_t back{};
    uint32_t filled = 0;
    ASSERT_EQ(RUCCL_OK, decode(c0, &back, &filled));
    std::vector<unsigned char> other = c2;
    other[3] = 5;  // num_nodes 5
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, decode(other, &back, &filled));
    EXPECT_EQ(nullptr, back.nodes);
  }
  for (auto bad : {std::vector<unsigned char>(c0.begin(), c0.end() - 1), c0, std::vector<unsigned char>(c0.begin(), c0.begin() + 8)}) {
    if (bad.size() == c0.size()) bad.push_back(0);  // one byte too many
    ruccl_table_t back{};
    uint32_t filled = 0;
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, decode(bad, &back, &filled)) << bad.size();
    EXPECT_EQ(nullptr, back.nodes);
  }
  std::vector<unsigned char> empty = c0;
  empty.resize(RUCCL_TABLE_CHUNK_HEAD);
  empty[11] = 0;  // count 0
  ruccl_table_t back{};
  uint32_t filled = 0;
  EXPECT_EQ(RUCCL_ERR_PROTOCOL, decode(empty, &back, &filled));
}

// 600 nodes meet at one orchestrator at once: their table (some 220 KB) reaches every
// one of them whole, in chunks (as one frame, no node could take it), and none of
// them is lost in a full accept queue (a backlog of 128 left some 80 of 500 timing
// out).
TEST(Orchestrator, SixHundredNodesGetTheWholeTable) {
  Orchestrator orch;
  const uint32_t n = 600;
  // each node checks its own table and frees it at once (600 tables of 600 nodes
  // would be 1.6 GB together); what it found, "" when all was right
  std::vector<std::string> found(n);
  std::vector<int> fds(n, -1);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < n; i++)
    threads.emplace_back([&, i] {
      JoinResult r = join(orch.address(), make_join("crowd", n, {n - 1 - i}, 2000 + i), kSecret, 60000);
      if (r.rc != RUCCL_OK) {
        found[i] = r.error;
        return;
      }
      fds[i] = r.fd;
      if (r.table.num_nodes != n) found[i] = "a table of " + std::to_string(r.table.num_nodes) + " nodes";
      // sorted by peer id: peer k is node n - 1 - k's, whose port is 2000 + n - 1 - k
      for (uint32_t k = 0; found[i].empty() && k < n; k++)
        if (r.table.nodes[k].peer_ids[0] != k || r.table.nodes[k].data_port != 2000 + n - 1 - k)
          found[i] = "entry " + std::to_string(k) + " is port " + std::to_string(r.table.nodes[k].data_port);
      ruccl_table_free(&r.table);
    });
  for (auto &t : threads) t.join();
  for (uint32_t i = 0; i < n; i++) {
    EXPECT_EQ("", found[i]) << "node " << i;
    if (fds[i] >= 0) ruccl_bootstrap_leave(fds[i]);
  }
}

}  // namespace
