// Invariant checks: a failed DTRAIN_CHECK is a bug in dtrain, never a user error.
// User errors throw InvalidArgumentError with a message that says what to change.
#pragma once

#include <fmt/format.h>

#include "dtrain/error.h"

#define DTRAIN_CHECK(cond)                                                                   \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      throw ::dtrain::InternalError(                                                         \
          ::fmt::format("dtrain invariant failed at {}:{}: {}", __FILE__, __LINE__, #cond)); \
  } while (0)
