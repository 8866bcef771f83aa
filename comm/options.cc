#include "comm/options.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::comm {
namespace {

struct EnvVar {
  const char* name;
  const char* default_value;
  const char* description;
};

constexpr EnvVar kEnvVars[] = {
    {"TANDEM_COMM_TIMEOUT", "300s", "default timeout of Work::Wait(), Split and Shrink"},
    {"TANDEM_COMM_VERIFY", "0",
     "1: check collectives' count/type/op/root across ranks first (debug)"},
    {"TANDEM_COMM_WATCHDOG", "100ms", "NCCL watchdog polling interval"},
    {"TANDEM_COMM_WAIT", "auto", "MPI waits: spin, sleep, or auto (sleep if ranks > cores)"},
    {"TANDEM_COMM_SHARED_GPU", "auto",
     "ranks sharing a GPU: nccl (NCCL >= 2.30's multi-rank mode), mpi (host staging), or auto "
     "(nccl where the NCCL loaded allows it)"},
    {"TANDEM_COMM_NCCL_LINKS", "1",
     "1: NCCL transfers with declared peers on a communicator per ordered pair; 0: one"},
};

const char* Get(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

}  // namespace

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text) {
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &duration)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad duration '", text, "' (expected e.g. 300s, 2m, 250ms or seconds)"));
  }
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration must be positive and finite, got '", text, "'"));
  }
  return duration;
}

absl::StatusOr<CommOptions> CommOptions::FromEnvironment() {
  CommOptions options;
  if (const char* value = Get("TANDEM_COMM_TIMEOUT")) {
    auto parsed = ParseTimeout(value);
    if (!parsed.ok()) return Annotate(parsed.status(), "TANDEM_COMM_TIMEOUT");
    options.timeout = *parsed;
  }
  if (const char* value = Get("TANDEM_COMM_VERIFY")) {
    const std::string text = value;
    if (text == "1" || text == "true") {
      options.verify_collectives = true;
    } else if (text == "0" || text == "false") {
      options.verify_collectives = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_COMM_VERIFY: expected 0 or 1, got '", text, "'"));
    }
  }
  if (const char* value = Get("TANDEM_COMM_WATCHDOG")) {
    auto parsed = ParseTimeout(value);
    if (!parsed.ok()) return Annotate(parsed.status(), "TANDEM_COMM_WATCHDOG");
    options.watchdog_interval = *parsed;
  }
  if (const char* value = Get("TANDEM_COMM_WAIT")) {
    const std::string text = value;
    if (text == "auto") {
      options.wait_mode = WaitMode::kAuto;
    } else if (text == "spin") {
      options.wait_mode = WaitMode::kSpin;
    } else if (text == "sleep") {
      options.wait_mode = WaitMode::kSleep;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_COMM_WAIT: expected auto, spin or sleep, got '", text, "'"));
    }
  }
  if (const char* value = Get("TANDEM_COMM_NCCL_LINKS")) {
    const std::string text = value;
    if (text == "1" || text == "0") {
      options.nccl_pair_links = text == "1";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_COMM_NCCL_LINKS: expected 0 or 1, got '", text, "'"));
    }
  }
  if (const char* value = Get("TANDEM_COMM_SHARED_GPU")) {
    const std::string text = value;
    if (text == "auto") {
      options.shared_gpu = SharedGpuMode::kAuto;
    } else if (text == "nccl") {
      options.shared_gpu = SharedGpuMode::kNccl;
    } else if (text == "mpi") {
      options.shared_gpu = SharedGpuMode::kMpi;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "TANDEM_COMM_SHARED_GPU: expected auto, nccl or mpi, got '", text, "'"));
    }
  }
  return options;
}

const char* SharedGpuModeName(SharedGpuMode mode) {
  switch (mode) {
    case SharedGpuMode::kAuto: return "auto";
    case SharedGpuMode::kNccl: return "nccl";
    case SharedGpuMode::kMpi: return "mpi";
  }
  return "auto";
}

std::string DescribeCommEnvironment() {
  std::string out;
  for (const EnvVar& var : kEnvVars) {
    const char* value = Get(var.name);
    absl::StrAppend(&out, var.name, "=", value ? value : "(unset)", " [default ",
                    var.default_value, "]: ", var.description, "\n");
  }
  return out;
}

}  // namespace tandem::comm
