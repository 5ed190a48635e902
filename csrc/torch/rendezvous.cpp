// rendezvous.cpp — the backend's birth: a ruCCL registration whose rendezvous goes
// through the c10d::Store torch hands the backend (so no extra server runs), its session
// secret, and the liveness timeout a training job wants.
#include "ProcessGroupRuccl.hpp"

#include <c10/util/Logging.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "errors.hpp"
#include "streams.hpp"

namespace ruccl_torch {
namespace {

// The store adapter: torch's c10d::Store behind ruccl_store_t.

ruccl_result_t store_set(void *ctx, const char *key, const void *value, size_t len) {
  try {
    auto *store = static_cast<c10d::Store *>(ctx);
    const auto *p = static_cast<const uint8_t *>(value);
    store->set(key, std::vector<uint8_t>(p, p + len));
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

ruccl_result_t store_get(void *ctx, const char *key, void *value, size_t cap, size_t *len, int64_t timeout_ms) {
  auto *store = static_cast<c10d::Store *>(ctx);
  try {
    store->wait({key}, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1)));
  } catch (const std::exception &) {
    return RUCCL_ERR_TIMEOUT;
  }
  try {
    std::vector<uint8_t> v = store->get(key);
    *len = v.size();
    std::memcpy(value, v.data(), std::min(cap, v.size()));
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

ruccl_result_t store_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  try {
    *result = static_cast<c10d::Store *>(ctx)->add(key, delta);
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

// A group name the registry keeps apart from every other group of this process.
std::string group_name_for(const std::string &group_id) {
  std::string name = "torch.";
  for (char c : group_id) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (name.size() >= RUCCL_MAX_GROUP_NAME) {
    name = "torch." + std::to_string(std::hash<std::string>{}(group_id));
  }
  return name;
}

// Rank 0 draws a random secret for the group and shares it through the store, once
// for the store's lifetime: every later session of the group on this store (a
// torchrun restart keeps its store) reads the same one, so no session can read
// another attempt's secret, whichever ranks of an attempt died before they got here.
std::string shared_secret(c10d::Store &store, const std::string &base, int rank,
                          std::chrono::milliseconds timeout) {
  const std::string key = base + "/secret";
  if (rank == 0 && !store.check({key})) {
    std::random_device rd;
    std::vector<uint8_t> bytes(32);
    for (auto &b : bytes) b = static_cast<uint8_t>(rd() & 0xff);
    store.set(key, bytes);
    OPENSSL_cleanse(bytes.data(), bytes.size());
  }
  store.wait({key}, timeout);
  auto v = store.get(key);
  std::string secret(v.begin(), v.end());
  OPENSSL_cleanse(v.data(), v.size());
  return secret;
}

}  // namespace

ProcessGroupRuccl::ProcessGroupRuccl(const RucclOptions &o) : c10d::Backend(o.rank, o.size) {
  FlightRecorder &recorder = FlightRecorder::get(); // a bad RUCCL_TRACE_BUFFER fails here, before the rendezvous
  ruccl_config_t cfg = ruccl_config_default();
  check(ruccl_config_set_num_devices(&cfg, 1));
  check(ruccl_config_set_timeout_ms(&cfg, std::max<int64_t>(o.timeout.count(), 1)));
  const std::string group = group_name_for(o.group_id);
  check(ruccl_config_set_group_name(&cfg, group.c_str()));
  if (o.size > 1) {
    if (!o.store) fail(RUCCL_ERR_INVALID_CONFIG, "the backend needs torch's store to rendezvous");
    // The session secret (no stranger joins the data connections): RUCCL_SECRET or
    // RUCCL_SECRET_FILE, else one rank 0 shares through the store (as strong as the
    // store is private: said once per process).
    std::string secret;
    const char *env = std::getenv("RUCCL_SECRET"), *file = std::getenv("RUCCL_SECRET_FILE");
    if ((env && *env) || (file && *file)) {
      unsigned char key[RUCCL_MAX_SECRET];
      size_t len = 0;
      check(ruccl_secret_from_env(key, &len));
      secret.assign(reinterpret_cast<const char *>(key), len);
      OPENSSL_cleanse(key, sizeof key);
    } else {
      static std::once_flag warned;
      std::call_once(warned, [] {
        LOG(WARNING) << "ruccl: no RUCCL_SECRET or RUCCL_SECRET_FILE: rank 0 shares a random session secret "
                        "through torch's store, so authentication is only as strong as access to the store "
                        "(MASTER_ADDR:MASTER_PORT); give every rank the same RUCCL_SECRET or RUCCL_SECRET_FILE "
                        "for real authentication";
      });
      try {
        secret = shared_secret(*o.store, "ruccl/" + group, o.rank, o.timeout);
      } catch (const std::exception &e) {
        fail(RUCCL_ERR_TIMEOUT, std::string("the session secret did not come through the store: ") + e.what());
      }
    }
    // A training job wants a frozen rank found in seconds, not the core's 30 s: torchrun
    // restarts the job from its last checkpoint only once every survivor has exited.
    // RUCCL_LIVENESS_TIMEOUT_MS still decides where it is set (0: no watch).
    const char *liveness = std::getenv("RUCCL_LIVENESS_TIMEOUT_MS");
    if (!liveness || !*liveness) check(ruccl_config_set_liveness_timeout_ms(&cfg, kTrainingLivenessTimeoutMs));
    ruccl_store_t st{store_set, store_get, store_add, o.store.get()};
    check(ruccl_config_set_num_nodes(&cfg, static_cast<unsigned>(o.size)));
    check(ruccl_config_set_store(&cfg, &st));
    check(ruccl_config_set_node_address(&cfg, o.node_address.c_str()));
    check(ruccl_config_set_data_service_port(&cfg, 0));
    check(ruccl_config_set_secret(&cfg, secret.data(), secret.size()));
    OPENSSL_cleanse(secret.data(), secret.size());
  }
  check(ruccl_register(static_cast<uint32_t>(o.rank), ruccl_device_t{RUCCL_DEVICE_CPU, 0}, &cfg, &comm_));
  recorder.note_process_rank(o.rank);
  trace_group_ = recorder.add_group(o.group_id, o.rank, o.size);
  timeout_ms_ = std::max<int64_t>(o.timeout.count(), 1);
  group_id_ = o.group_id;
  start_threads();
}

void ProcessGroupRuccl::start_threads() {
  for (int i = 0; i < 2; i++) workers_.emplace_back(worker_loop, this, q_);
  completer_ = std::thread(completer_loop, p2p_);
}

}  // namespace ruccl_torch
