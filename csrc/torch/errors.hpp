// errors.hpp — the shim's error text.  Every error a rank raises is a
// std::runtime_error whose message starts with the ruCCL error's name
// ("RUCCL_ERR_SHAPE_MISMATCH: ..."): the core's own message when the core failed (the
// same on every rank), else the shim's check that refused the call.
#pragma once

#include <stdexcept>
#include <string>

extern "C" {
#include "ruccl.h"
}

namespace ruccl_torch {

[[noreturn]] inline void fail(ruccl_result_t rc, const std::string &detail) {
  throw std::runtime_error(std::string(ruccl_error_string(rc)) + ": " + detail);
}

inline void check(ruccl_result_t rc) {
  if (rc == RUCCL_OK) return;
  const char *why = ruccl_last_error();
  throw std::runtime_error(why && *why ? std::string(why) : std::string(ruccl_error_string(rc)));
}

}  // namespace ruccl_torch
