// Small helpers for absl::Status plumbing. Abseil 20220623 ships no status macros.
#ifndef ONEBIT_COMMON_STATUS_MACROS_H_
#define ONEBIT_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function if `expr` yields a non-OK absl::Status.
#define ONEBIT_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::absl::Status onebit_status_ = (expr);           \
    if (!onebit_status_.ok()) return onebit_status_;  \
  } while (0)

#define ONEBIT_CONCAT_INNER_(a, b) a##b
#define ONEBIT_CONCAT_(a, b) ONEBIT_CONCAT_INNER_(a, b)

// `ONEBIT_ASSIGN_OR_RETURN(auto x, StatusOrExpr());` assigns the value or returns the error.
#define ONEBIT_ASSIGN_OR_RETURN(lhs, expr) \
  ONEBIT_ASSIGN_OR_RETURN_IMPL_(ONEBIT_CONCAT_(onebit_statusor_, __LINE__), lhs, expr)

#define ONEBIT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // ONEBIT_COMMON_STATUS_MACROS_H_
