/* test_config.cc — the configuration (defaults, validating setters, the all-or-none
   multi-node settings), the names of the result codes, ruccl_last_error, dtype
   sizes, and a check of the suite's own half-precision helpers. */
#include "test_util.h"

namespace {

using namespace rt;

/* ------------------------------------------------------------ defaults */

TEST(Config, DefaultValues) {
  ruccl_config_t c = ruccl_config_default();
  EXPECT_EQ(1u, c.num_devices);
  EXPECT_EQ(RUCCL_STRATEGY_AUTO, c.local_strategy.kind);
  EXPECT_EQ(RUCCL_STRATEGY_AUTO, c.global_strategy.kind);
  EXPECT_GT(c.timeout_ms, 0);
  EXPECT_EQ(RUCCL_DEFAULT_TIMEOUT_MS, c.timeout_ms);
  EXPECT_EQ(0u, c.multi_node_set);
  EXPECT_STREQ("default", c.group_name);
  EXPECT_STREQ(RUCCL_DEFAULT_GROUP_NAME, c.group_name);
  EXPECT_EQ(0u, c.secret_len);
  EXPECT_LT(c.liveness_timeout_ms, 0) << "unset: the environment's, else the default";
}

TEST(Config, DefaultIsAPlainValue) {
  ruccl_config_t a = ruccl_config_default();
  ruccl_config_t b = ruccl_config_default();
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof a)) << "two defaults differ (uninitialised bytes?)";
}

/* ------------------------------------------------------------- setters */

TEST(Config, SettersStoreWhatTheyAreGiven) {
  ruccl_config_t c = ruccl_config_default();
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_devices(&c, 7));
  EXPECT_EQ(7u, c.num_devices);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_local_strategy(&c, Tree(3).value()));
  EXPECT_EQ(RUCCL_STRATEGY_TREE, c.local_strategy.kind);
  EXPECT_EQ(3u, c.local_strategy.arity);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_global_strategy(&c, Ring().value()));
  EXPECT_EQ(RUCCL_STRATEGY_RING, c.global_strategy.kind);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_timeout_ms(&c, 1234));
  EXPECT_EQ(1234, c.timeout_ms);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_liveness_timeout_ms(&c, 4321));
  EXPECT_EQ(4321, c.liveness_timeout_ms);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_liveness_timeout_ms(&c, 0));
  EXPECT_EQ(0, c.liveness_timeout_ms) << "0: no watch";
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_group_name(&c, "my-group"));
  EXPECT_STREQ("my-group", c.group_name);
  const char key[] = "s3cr3t\0with-nul";
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_secret(&c, key, sizeof key));
  EXPECT_EQ(sizeof key, c.secret_len);
  EXPECT_EQ(0, std::memcmp(c.secret, key, sizeof key));
  EXPECT_EQ(0u, c.multi_node_set) << "none of the four multi-node settings was given";
}

TEST(Config, MultiNodeSettersSetTheirBits) {
  ruccl_config_t c = ruccl_config_default();
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_nodes(&c, 3));
  EXPECT_EQ(3u, c.num_nodes);
  EXPECT_EQ(RUCCL_CONFIG_NUM_NODES, c.multi_node_set);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_global_address(&c, "127.0.0.1:4000"));
  EXPECT_STREQ("127.0.0.1:4000", c.global_address);
  EXPECT_EQ(RUCCL_CONFIG_NUM_NODES | RUCCL_CONFIG_GLOBAL_ADDRESS, c.multi_node_set);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_node_address(&c, "127.0.0.1"));
  EXPECT_STREQ("127.0.0.1", c.node_address);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&c, 0));
  EXPECT_EQ(0u, c.data_service_port);
  EXPECT_EQ(RUCCL_CONFIG_MULTI_NODE_ALL, c.multi_node_set);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&c, 65535));
  EXPECT_EQ(65535u, c.data_service_port);
}

ruccl_result_t NoSet(void *, const char *, const void *, size_t) { return RUCCL_OK; }
ruccl_result_t NoGet(void *, const char *, void *, size_t, size_t *, int64_t) { return RUCCL_ERR_TIMEOUT; }
ruccl_result_t NoAdd(void *, const char *, int64_t, int64_t *) { return RUCCL_OK; }

// A store stands in for the global address among the four multi-node settings.
TEST(Config, StoreTakesTheGlobalAddressBitAndNeedsEveryCallback) {
  ruccl_config_t c = ruccl_config_default();
  int ctx = 0;
  ruccl_store_t st = {NoSet, NoGet, NoAdd, &ctx};
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_store(&c, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_store(nullptr, &st));
  for (int missing = 0; missing < 3; missing++) {
    ruccl_store_t bad = st;
    if (missing == 0) bad.set = nullptr;
    if (missing == 1) bad.get = nullptr;
    if (missing == 2) bad.add = nullptr;
    EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_store(&c, &bad)) << missing;
  }
  EXPECT_EQ(0u, c.multi_node_set);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_store(&c, &st));
  EXPECT_EQ(RUCCL_CONFIG_GLOBAL_ADDRESS, c.multi_node_set);
  EXPECT_EQ(&ctx, c.store.ctx);
}

TEST(Config, EverySetterRejectsANullConfig) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_num_devices(nullptr, 2));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_local_strategy(nullptr, Ring().value()));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_strategy(nullptr, Ring().value()));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_num_nodes(nullptr, 2));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_address(nullptr, "127.0.0.1:1"));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_node_address(nullptr, "127.0.0.1"));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_data_service_port(nullptr, 1));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_timeout_ms(nullptr, 10));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_liveness_timeout_ms(nullptr, 10));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_secret(nullptr, "k", 1));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_group_name(nullptr, "g"));
}

/* A rejected value leaves the configuration exactly as it was. */
class ConfigRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = ruccl_config_default();
    ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_devices(&cfg_, 3));
    ASSERT_EQ(RUCCL_OK, ruccl_config_set_group_name(&cfg_, "before"));
    before_ = cfg_;
  }
  void ExpectUnchanged() { EXPECT_EQ(0, std::memcmp(&cfg_, &before_, sizeof cfg_)) << "a rejected setter modified the config"; }
  ruccl_config_t cfg_;
  ruccl_config_t before_;
};

TEST_F(ConfigRejects, ZeroDevices) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_num_devices(&cfg_, 0));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, NonPositiveTimeout) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_timeout_ms(&cfg_, 0));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_timeout_ms(&cfg_, -1));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_timeout_ms(&cfg_, INT64_MIN));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, NegativeLivenessTimeout) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_liveness_timeout_ms(&cfg_, -1));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_liveness_timeout_ms(&cfg_, INT64_MIN));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, TreeArityZero) {
  ruccl_strategy_t s = Tree(0).value();
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_local_strategy(&cfg_, s));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_strategy(&cfg_, s));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, StrategyKindOutOfRange) {
  for (int kind : {4, 5, 99, -1}) {
    ruccl_strategy_t s;
    s.kind = static_cast<ruccl_strategy_kind_t>(kind);
    s.arity = 2;
    EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_local_strategy(&cfg_, s)) << "kind " << kind;
    EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_strategy(&cfg_, s)) << "kind " << kind;
  }
  ExpectUnchanged();
}

TEST_F(ConfigRejects, BadGroupNames) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_group_name(&cfg_, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_group_name(&cfg_, ""));
  std::string too_long(RUCCL_MAX_GROUP_NAME, 'x'); /* no room left for the NUL */
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_group_name(&cfg_, too_long.c_str()));
  std::string much_too_long(1000, 'y');
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_group_name(&cfg_, much_too_long.c_str()));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, LongestGroupNameFits) {
  std::string longest(RUCCL_MAX_GROUP_NAME - 1, 'z');
  EXPECT_EQ(RUCCL_OK, ruccl_config_set_group_name(&cfg_, longest.c_str()));
  EXPECT_EQ(longest, std::string(cfg_.group_name));
}

TEST_F(ConfigRejects, SecretTooLong) {
  std::vector<unsigned char> key(RUCCL_MAX_SECRET + 1, 0x42);
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_secret(&cfg_, key.data(), key.size()));
  ExpectUnchanged();
  EXPECT_EQ(RUCCL_OK, ruccl_config_set_secret(&cfg_, key.data(), RUCCL_MAX_SECRET)) << "the longest secret fits";
  EXPECT_EQ(static_cast<size_t>(RUCCL_MAX_SECRET), cfg_.secret_len);
}

TEST_F(ConfigRejects, BadAddresses) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_address(&cfg_, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_address(&cfg_, ""));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_node_address(&cfg_, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_node_address(&cfg_, ""));
  std::string too_long(RUCCL_MAX_ADDRESS, 'a');
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_global_address(&cfg_, too_long.c_str()));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_node_address(&cfg_, too_long.c_str()));
  ExpectUnchanged();
  EXPECT_EQ(0u, cfg_.multi_node_set) << "a rejected address must not count as given";
}

TEST_F(ConfigRejects, PortAbove65535) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_data_service_port(&cfg_, 65536));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_data_service_port(&cfg_, 1u << 31));
  ExpectUnchanged();
}

TEST_F(ConfigRejects, ZeroNodes) {
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_num_nodes(&cfg_, 0));
  ExpectUnchanged();
}

/* --------------------------------------------- multi-node at registration */

/* Each of the 14 proper, non-empty subsets of the four multi-node settings. */
TEST(ConfigRegister, PartialMultiNodeSettingsAreInvalidConfig) {
  for (unsigned mask = 1; mask < RUCCL_CONFIG_MULTI_NODE_ALL; mask++) {
    ruccl_config_t c = MakeConfig(1, Auto(), 1000);
    if (mask & RUCCL_CONFIG_NUM_NODES) { ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_nodes(&c, 2)); }
    if (mask & RUCCL_CONFIG_GLOBAL_ADDRESS) { ASSERT_EQ(RUCCL_OK, ruccl_config_set_global_address(&c, "127.0.0.1:1")); }
    if (mask & RUCCL_CONFIG_NODE_ADDRESS) { ASSERT_EQ(RUCCL_OK, ruccl_config_set_node_address(&c, "127.0.0.1")); }
    if (mask & RUCCL_CONFIG_DATA_SERVICE_PORT) { ASSERT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&c, 0)); }
    ruccl_comm_t *comm = nullptr;
    int64_t t0 = NowMs();
    EXPECT_EQ(RUCCL_ERR_INVALID_CONFIG, ruccl_register(0, Cpu(), &c, &comm)) << "settings mask 0x" << std::hex << mask;
    EXPECT_LT(NowMs() - t0, 500) << "an invalid config is refused before any waiting";
    EXPECT_EQ(nullptr, comm);
    EXPECT_STRNE("", ruccl_last_error());
    if (comm) ruccl_finish(comm);
  }
}

/* All four multi-node settings, but nobody listens at the orchestrator's address:
   a timeout after the configured time, not an endless retry.  (Real multi-node
   sessions are in test_multinode.cc.) */
TEST(ConfigRegister, UnreachableOrchestratorTimesOut) {
  ruccl_config_t c = MakeConfig(1, Auto(), 300);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_secret(&c, "s", 1));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_num_nodes(&c, 2));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_global_address(&c, "127.0.0.1:1"));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_node_address(&c, "127.0.0.1"));
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&c, 0));
  ruccl_comm_t *comm = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, ruccl_register(0, Cpu(), &c, &comm)) << ruccl_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(nullptr, comm);
  if (comm) ruccl_finish(comm);
}

/* The environment's secret variables, cleared for a test and put back after it. */
class SecretEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char *k : {"RUCCL_SECRET", "RUCCL_SECRET_FILE"}) {
      const char *v = getenv(k);
      saved_.push_back({k, v ? v : "", v != nullptr});
      unsetenv(k);
    }
  }
  void TearDown() override {
    for (auto &s : saved_) {
      if (s.set) setenv(s.key, s.value.c_str(), 1);
      else unsetenv(s.key);
    }
    for (auto &f : files_) unlink(f.c_str());
  }
  // A file holding these bytes; removed after the test.
  std::string File(const std::string &bytes) {
    char path[] = "/tmp/ruccl-secret-test-XXXXXX";
    int fd = mkstemp(path);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ssize_t(bytes.size()), write(fd, bytes.data(), bytes.size()));
    close(fd);
    files_.push_back(path);
    return path;
  }
  // A multi-node configuration whose orchestrator nobody runs (port 1): what
  // registration says before it would wait, or TIMEOUT once it has tried.
  static ruccl_result_t Register(const char *secret) {
    ruccl_config_t c = MakeConfig(1, Auto(), 200);
    EXPECT_EQ(RUCCL_OK, ruccl_config_set_num_nodes(&c, 2));
    EXPECT_EQ(RUCCL_OK, ruccl_config_set_global_address(&c, "127.0.0.1:1"));
    EXPECT_EQ(RUCCL_OK, ruccl_config_set_node_address(&c, "127.0.0.1"));
    EXPECT_EQ(RUCCL_OK, ruccl_config_set_data_service_port(&c, 0));
    if (secret) EXPECT_EQ(RUCCL_OK, ruccl_config_set_secret(&c, secret, strlen(secret)));
    ruccl_comm_t *comm = nullptr;
    ruccl_result_t rc = ruccl_register(0, Cpu(), &c, &comm);
    EXPECT_EQ(nullptr, comm);
    if (comm) ruccl_finish(comm);
    return rc;
  }
  struct Saved {
    const char *key;
    std::string value;
    bool set;
  };
  std::vector<Saved> saved_;
  std::vector<std::string> files_;
};

/* Secure by default: a multi-node session never runs keyed with an empty secret.
   Registration refuses at once and says the three ways to give one. */
TEST_F(SecretEnv, MultiNodeWithoutASecretIsInvalidConfig) {
  int64_t t0 = NowMs();
  EXPECT_EQ(RUCCL_ERR_INVALID_CONFIG, Register(nullptr));
  EXPECT_LT(NowMs() - t0, 500) << "refused before any waiting";
  std::string why = ruccl_last_error();
  for (const char *way : {"ruccl_config_set_secret", "RUCCL_SECRET", "RUCCL_SECRET_FILE"})
    EXPECT_NE(why.find(way), std::string::npos) << why;
  // A single-node configuration needs none.
  ruccl_config_t c = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_register(0, Cpu(), &c, &comm)) << ruccl_last_error();
  ruccl_finish(comm);
  // The configuration's own secret: registration goes on (to the timeout here).
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, Register("set"));
}

TEST_F(SecretEnv, TheEnvironmentGivesTheSecretWhenTheConfigurationHasNone) {
  setenv("RUCCL_SECRET", "from-env", 1);
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, Register(nullptr)) << ruccl_last_error();
  unsigned char out[RUCCL_MAX_SECRET];
  size_t len = 0;
  ASSERT_EQ(RUCCL_OK, ruccl_secret_from_env(out, &len));
  EXPECT_EQ("from-env", std::string(reinterpret_cast<char *>(out), len));

  unsetenv("RUCCL_SECRET");
  std::string bytes("with\0nul\n", 10);  // every byte counts, a newline and a NUL too
  setenv("RUCCL_SECRET_FILE", File(bytes).c_str(), 1);
  ASSERT_EQ(RUCCL_OK, ruccl_secret_from_env(out, &len)) << ruccl_last_error();
  EXPECT_EQ(bytes, std::string(reinterpret_cast<char *>(out), len));
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, Register(nullptr)) << ruccl_last_error();

  setenv("RUCCL_SECRET", "wins", 1);  // RUCCL_SECRET before the file
  ASSERT_EQ(RUCCL_OK, ruccl_secret_from_env(out, &len));
  EXPECT_EQ("wins", std::string(reinterpret_cast<char *>(out), len));
}

TEST_F(SecretEnv, ABadSecretFileIsInvalidConfigNamingIt) {
  const std::string missing = "/nonexistent/ruccl-secret";
  for (const std::string &path : {missing, File(""), File(std::string(RUCCL_MAX_SECRET + 1, 'x'))}) {
    setenv("RUCCL_SECRET_FILE", path.c_str(), 1);
    EXPECT_EQ(RUCCL_ERR_INVALID_CONFIG, Register(nullptr)) << path;
    EXPECT_NE(std::string(ruccl_last_error()).find(path), std::string::npos) << ruccl_last_error();
  }
  setenv("RUCCL_SECRET_FILE", File(std::string(RUCCL_MAX_SECRET, 'x')).c_str(), 1);  // the longest allowed
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, Register(nullptr)) << ruccl_last_error();
  setenv("RUCCL_SECRET", std::string(RUCCL_MAX_SECRET + 1, 'y').c_str(), 1);
  EXPECT_EQ(RUCCL_ERR_INVALID_CONFIG, Register(nullptr));
}

/* Fields written directly (not through the setters) are validated at registration. */
TEST(ConfigRegister, RegisterValidatesAHandWrittenConfig) {
  ruccl_comm_t *comm = nullptr;
  ruccl_config_t c = MakeConfig(1);
  c.num_devices = 0;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &c, &comm));
  c = MakeConfig(1);
  c.timeout_ms = 0;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &c, &comm));
  c = MakeConfig(1);
  c.group_name[0] = '\0';
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &c, &comm));
  c = MakeConfig(1);
  c.local_strategy.kind = static_cast<ruccl_strategy_kind_t>(42);
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &c, &comm));
  c = MakeConfig(1);
  c.local_strategy.kind = RUCCL_STRATEGY_TREE;
  c.local_strategy.arity = 0;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &c, &comm));
  EXPECT_EQ(nullptr, comm);
  if (comm) ruccl_finish(comm);
}

/* ------------------------------------------------------- error strings */

TEST(ErrorString, EveryCodeIsNamedAfterItsEnum) {
  std::vector<std::string> seen;
  for (int code = RUCCL_OK; code < RUCCL_NUM_RESULTS; code++) {
    const char *s = ruccl_error_string(static_cast<ruccl_result_t>(code));
    ASSERT_NE(nullptr, s) << "code " << code;
    EXPECT_STRNE("", s) << "code " << code;
    EXPECT_EQ(0, std::strncmp(s, "RUCCL_", 6)) << s;
    if (static_cast<unsigned>(code) < kKnownResultNames) {
      EXPECT_STREQ(TestResultName(static_cast<ruccl_result_t>(code)), s);
    }
    for (const std::string &other : seen) {
      EXPECT_NE(other, s) << "two codes share a name";
    }
    seen.push_back(s);
  }
  EXPECT_EQ(static_cast<size_t>(RUCCL_NUM_RESULTS), seen.size());
  EXPECT_GE(static_cast<unsigned>(RUCCL_NUM_RESULTS), kKnownResultNames);
}

TEST(ErrorString, SomeExactNames) {
  EXPECT_STREQ("RUCCL_OK", ruccl_error_string(RUCCL_OK));
  EXPECT_STREQ("RUCCL_ERR_SHAPE_MISMATCH", ruccl_error_string(RUCCL_ERR_SHAPE_MISMATCH));
  EXPECT_STREQ("RUCCL_ERR_PEER_FINISHED", ruccl_error_string(RUCCL_ERR_PEER_FINISHED));
  EXPECT_STREQ("RUCCL_ERR_UNSUPPORTED", ruccl_error_string(RUCCL_ERR_UNSUPPORTED));
}

TEST(ErrorString, OutOfRangeCodesStillGiveAString) {
  for (int code : {static_cast<int>(RUCCL_NUM_RESULTS), RUCCL_NUM_RESULTS + 1, 1000, -1, INT32_MIN}) {
    const char *s = ruccl_error_string(static_cast<ruccl_result_t>(code));
    ASSERT_NE(nullptr, s) << "code " << code;
    EXPECT_STRNE("", s) << "code " << code;
  }
}

TEST(LastError, NonEmptyAfterAFailure) {
  ruccl_config_t c = ruccl_config_default();
  ASSERT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_num_devices(&c, 0));
  ASSERT_NE(nullptr, ruccl_last_error());
  EXPECT_STRNE("", ruccl_last_error());
}

TEST(LastError, IsPerThread) {
  ruccl_config_t c = ruccl_config_default();
  ASSERT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_config_set_timeout_ms(&c, -5));
  std::string mine = ruccl_last_error();
  ASSERT_FALSE(mine.empty());
  std::string theirs;
  std::thread t([&] {
    ruccl_config_t d = ruccl_config_default();
    ruccl_config_set_group_name(&d, "");
    theirs = ruccl_last_error();
  });
  t.join();
  EXPECT_FALSE(theirs.empty());
  EXPECT_EQ(mine, std::string(ruccl_last_error())) << "another thread's failure changed this thread's detail";
}

/* ---------------------------------------------------------- dtype size */

TEST(Dtype, Sizes) {
  EXPECT_EQ(4u, ruccl_dtype_size(RUCCL_FLOAT32));
  EXPECT_EQ(8u, ruccl_dtype_size(RUCCL_FLOAT64));
  EXPECT_EQ(2u, ruccl_dtype_size(RUCCL_FLOAT16));
  EXPECT_EQ(2u, ruccl_dtype_size(RUCCL_BFLOAT16));
  EXPECT_EQ(1u, ruccl_dtype_size(RUCCL_INT8));
  EXPECT_EQ(1u, ruccl_dtype_size(RUCCL_UINT8));
  EXPECT_EQ(4u, ruccl_dtype_size(RUCCL_INT32));
  EXPECT_EQ(8u, ruccl_dtype_size(RUCCL_INT64));
  EXPECT_EQ(0u, ruccl_dtype_size(static_cast<ruccl_dtype_t>(99)));
  EXPECT_EQ(0u, ruccl_dtype_size(static_cast<ruccl_dtype_t>(-1)));
}

/* ---------------------------------------- the suite's own half helpers */

TEST(TestHelpers, HalfConversionKnownValues) {
  EXPECT_EQ(0x3c00, FloatToHalf(1.0f));
  EXPECT_EQ(0xc000, FloatToHalf(-2.0f));
  EXPECT_EQ(0x7bff, FloatToHalf(65504.0f));
  EXPECT_EQ(0x7c00, FloatToHalf(65520.0f));
  EXPECT_EQ(0x0001, FloatToHalf(5.9604644775390625e-8f));
  EXPECT_EQ(0x0000, FloatToHalf(2.98023223876953125e-8f)) << "a tie rounds to even (zero)";
  EXPECT_EQ(0x3c00, FloatToHalf(1.0f + 1.0f / 2048)) << "a tie rounds to even";
  EXPECT_EQ(0x3c02, FloatToHalf(1.0f + 3.0f / 2048)) << "a tie rounds to even";
  EXPECT_EQ(0x3555, FloatToHalf(1.0f / 3.0f));
  EXPECT_EQ(1.0f, HalfToFloat(0x3c00));
  EXPECT_EQ(5.9604644775390625e-8f, HalfToFloat(0x0001));
  EXPECT_EQ(0x3f80, FloatToBf16(1.0f));
  EXPECT_EQ(0x3f80, FloatToBf16(1.00390625f)) << "a tie rounds to even";
  EXPECT_EQ(0x3f82, FloatToBf16(1.01171875f)) << "a tie rounds to even";
  EXPECT_EQ(-3.0f, Bf16ToFloat(FloatToBf16(-3.0f)));
}

TEST(TestHelpers, HalfRoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    if ((h & 0x7c00u) == 0x7c00u) continue; /* inf, nan */
    ASSERT_EQ(h, FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)))) << std::hex << h;
  }
}

#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST(TestHelpers, HalfConversionMatchesTheCompiler) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int k = 0; k < 200000; k++) {
    float f = (k & 1) ? dist(rng) : small(rng);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    ASSERT_EQ(bits, FloatToHalf(f)) << f;
  }
}
#endif

}  // namespace
