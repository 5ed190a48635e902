// test_orchestrator_program.cc — the program `ruccl-orchestrator --listen HOST:PORT`
// as a user runs it: the secret from RUCCL_SECRET or --secret-file, the bound
// address printed once it is ready, a node session through it, a clean exit on
// SIGTERM, and a clear failure for bad arguments.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

extern char **environ;

namespace {

struct Program {
  pid_t pid = -1;
  FILE *out = nullptr;
};

Program start(const std::vector<std::string> &args, const std::string &secret_env) {
  int pipefd[2];
  EXPECT_EQ(0, pipe(pipefd));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  std::vector<std::string> env;
  for (char **e = environ; *e; e++)
    if (strncmp(*e, "RUCCL_SECRET=", 13) != 0) env.push_back(*e);
  if (!secret_env.empty()) env.push_back("RUCCL_SECRET=" + secret_env);
  std::vector<char *> envp, argv;
  for (auto &e : env) envp.push_back(const_cast<char *>(e.c_str()));
  envp.push_back(nullptr);
  std::string bin = RUCCL_ORCHESTRATOR_BIN;
  argv.push_back(const_cast<char *>(bin.c_str()));
  for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  Program p;
  EXPECT_EQ(0, posix_spawn(&p.pid, bin.c_str(), &fa, nullptr, argv.data(), envp.data()));
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  p.out = fdopen(pipefd[0], "r");
  return p;
}

int stop(Program &p, int sig = SIGTERM) {
  if (sig) kill(p.pid, sig);
  int st = 0;
  waitpid(p.pid, &st, 0);
  if (p.out) fclose(p.out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A one-node session through the orchestrator at addr, with this secret.
ruccl_result_t join_once(const std::string &addr, const char *secret) {
  ruccl_join_t j;
  memset(&j, 0, sizeof j);
  snprintf(j.group, sizeof j.group, "program");
  j.num_nodes = 1;
  snprintf(j.address, sizeof j.address, "127.0.0.1");
  j.data_port = 1000;
  j.num_local = 1;
  int fd = -1;
  ruccl_table_t t{};
  unsigned char key[RUCCL_AUTH_KEY_BYTES];
  EXPECT_EQ(RUCCL_OK, ruccl_auth_key(secret, strlen(secret), key));
  ruccl_result_t rc = ruccl_bootstrap_join(addr.c_str(), key, &j, ruccl_now_ns() + 3000000000LL, &fd, &t);
  if (rc == RUCCL_OK) {
    EXPECT_EQ(1u, t.num_nodes);
    ruccl_table_free(&t);
    ruccl_bootstrap_leave(fd);
  }
  return rc;
}

std::string ready_address(Program &p) {
  char line[256] = {0};
  if (!fgets(line, sizeof line, p.out)) return "";
  std::string s(line);
  const std::string prefix = "listening on ";
  if (s.rfind(prefix, 0) != 0) return "";
  s = s.substr(prefix.size());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

TEST(OrchestratorProgram, SecretFromTheEnvironment) {
  Program p = start({"--listen", "127.0.0.1:0"}, "env-secret");
  std::string addr = ready_address(p);
  ASSERT_NE("", addr);
  EXPECT_EQ(RUCCL_OK, join_once(addr, "env-secret")) << ruccl_last_error();
  EXPECT_EQ(RUCCL_ERR_AUTH, join_once(addr, "other"));
  EXPECT_EQ(RUCCL_OK, join_once(addr, "env-secret")) << "a refused stranger must not disturb it";
  EXPECT_EQ(0, stop(p));
}

// A file holding these bytes (a secret), removed when it goes out of scope.
struct SecretFile {
  std::string path;
  explicit SecretFile(const std::string &bytes) {
    char tmpl[] = "/tmp/ruccl-secret-XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ssize_t(bytes.size()), write(fd, bytes.data(), bytes.size()));
    close(fd);
    path = tmpl;
  }
  ~SecretFile() { unlink(path.c_str()); }
};

TEST(OrchestratorProgram, SecretFromAFileWinsOverTheEnvironment) {
  SecretFile file("file-secret");
  Program p = start({"--listen", "127.0.0.1:0", "--secret-file", file.path}, "env-secret");
  std::string addr = ready_address(p);
  ASSERT_NE("", addr);
  EXPECT_EQ(RUCCL_OK, join_once(addr, "file-secret")) << ruccl_last_error();
  EXPECT_EQ(RUCCL_ERR_AUTH, join_once(addr, "env-secret"));
  EXPECT_EQ(0, stop(p));
}

// Secure by default: without --secret-file, RUCCL_SECRET or RUCCL_SECRET_FILE the
// program does not start (an orchestrator keyed with nothing would admit anyone).
TEST(OrchestratorProgram, NoSecretRefusesToStart) {
  const char *file = getenv("RUCCL_SECRET_FILE");
  std::string saved = file ? file : "";
  unsetenv("RUCCL_SECRET_FILE");
  Program p = start({"--listen", "127.0.0.1:0"}, "");
  EXPECT_EQ(1, stop(p, 0));
  if (file) setenv("RUCCL_SECRET_FILE", saved.c_str(), 1);
}

TEST(OrchestratorProgram, SecretFileFromTheEnvironment) {
  SecretFile file("env-file\n");
  setenv("RUCCL_SECRET_FILE", file.path.c_str(), 1);
  Program p = start({"--listen", "127.0.0.1:0"}, "");
  unsetenv("RUCCL_SECRET_FILE");
  std::string addr = ready_address(p);
  ASSERT_NE("", addr);
  EXPECT_EQ(RUCCL_OK, join_once(addr, "env-file\n")) << ruccl_last_error();
  EXPECT_EQ(RUCCL_ERR_AUTH, join_once(addr, "env-file"));
  EXPECT_EQ(0, stop(p, SIGTERM));
}

TEST(OrchestratorProgram, BadArgumentsFail) {
  Program usage = start({}, "");
  EXPECT_EQ(2, stop(usage, 0));
  Program bad_addr = start({"--listen", "no-port-here"}, "");
  EXPECT_EQ(1, stop(bad_addr, 0));
  Program missing_file = start({"--listen", "127.0.0.1:0", "--secret-file", "/nonexistent/secret"}, "");
  EXPECT_EQ(1, stop(missing_file, 0));
}

}  // namespace
