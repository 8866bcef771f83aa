#include "comm/options.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

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

// Sets `out` from the variable `name` when it is set: one of `choices`, else InvalidArgument
// naming the variable, the choices and the value.
template <typename T>
absl::Status ParseChoice(const char* name,
                         std::initializer_list<std::pair<const char*, T>> choices, T* out) {
  const char* value = Get(name);
  if (value == nullptr) return absl::OkStatus();
  std::string known;
  for (const auto& [text, choice] : choices) {
    if (std::strcmp(value, text) == 0) {
      *out = choice;
      return absl::OkStatus();
    }
    absl::StrAppend(&known, known.empty() ? "" : ", ", text);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": expected one of ", known, "; got '", value, "'"));
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
  TANDEM_RETURN_IF_ERROR(ParseChoice<bool>(
      "TANDEM_COMM_VERIFY", {{"1", true}, {"true", true}, {"0", false}, {"false", false}},
      &options.verify_collectives));
  if (const char* value = Get("TANDEM_COMM_WATCHDOG")) {
    auto parsed = ParseTimeout(value);
    if (!parsed.ok()) return Annotate(parsed.status(), "TANDEM_COMM_WATCHDOG");
    options.watchdog_interval = *parsed;
  }
  TANDEM_RETURN_IF_ERROR(ParseChoice<WaitMode>(
      "TANDEM_COMM_WAIT",
      {{"auto", WaitMode::kAuto}, {"spin", WaitMode::kSpin}, {"sleep", WaitMode::kSleep}},
      &options.wait_mode));
  TANDEM_RETURN_IF_ERROR(ParseChoice<bool>("TANDEM_COMM_NCCL_LINKS", {{"1", true}, {"0", false}},
                                           &options.nccl_pair_links));
  TANDEM_RETURN_IF_ERROR(ParseChoice<SharedGpuMode>(
      "TANDEM_COMM_SHARED_GPU",
      {{"auto", SharedGpuMode::kAuto},
       {"nccl", SharedGpuMode::kNccl},
       {"mpi", SharedGpuMode::kMpi}},
      &options.shared_gpu));
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
