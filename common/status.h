// Status helpers shared by every module. tandem reports every error as absl::Status /
// absl::StatusOr<T>; codes tell the caller what to do (InvalidArgument: fix the input,
// FailedPrecondition: fix state first, Unavailable: retry, Aborted: re-form a group,
// DeadlineExceeded: a timeout). Messages carry context (file, field, rank, step).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define TANDEM_STATUS_CONCAT_INNER(a, b) a##b
#define TANDEM_STATUS_CONCAT(a, b) TANDEM_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status _tandem_status = (expr);          \
    if (!_tandem_status.ok()) return _tandem_status; \
  } while (0)

// `TANDEM_ASSIGN_OR_RETURN(auto x, F());` declares x from a StatusOr or returns its error.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_STATUS_CONCAT(_tandem_statusor_, __LINE__), lhs, expr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL(var, lhs, expr) \
  auto var = (expr);                                 \
  if (!var.ok()) return std::move(var).status();     \
  lhs = std::move(var).value()

namespace tandem {

// Prepends context ("reading plan.json: ") to a status message, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace tandem
