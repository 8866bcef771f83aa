#include "elastic/internal/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/printable.h"

namespace tandem::elastic::internal {

absl::StatusOr<KillPoint> ParseKill(const std::string& text) {
  KillPoint k;
  if (text.empty()) return k;
  static const std::set<std::string> kPoints = {
      "forward", "backward",   "sync", "commit",     "idle", "stop",
      "reform",  "checkpoint", "grow", "late-commit", "shrink", "export", "profiling",
      "templates"};
  for (absl::string_view one : absl::StrSplit(text, ',')) {
    std::vector<std::string> parts = absl::StrSplit(one, ':');
    KillPoint::Entry e;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &e.rank) ||
        !absl::SimpleAtoi(parts[1], &e.iteration) || !kPoints.count(parts[2])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fault injection '", Printable(text, 200),
          "': expected RANK:ITERATION:POINT[,...] (ITERATION from 0: 1:2:forward fires in the "
          "iteration logged as 3), POINT one of forward, backward, sync, "
          "commit, idle, stop (SIGSTOP in forward: a hung rank), reform (during the "
          "re-formation that resumes at ITERATION), shrink (in that re-formation, just before "
          "the survivors build their communicator), export (in that re-formation, as the "
          "rank exports its state), checkpoint (writing the checkpoint of step "
          "ITERATION), grow (not a death: the rank sends itself SIGUSR2 in forward, asking the "
          "job to grow by a node), late-commit (not a death: the rank records the commit of "
          "ITERATION only once the survivors have agreed), profiling (while the job starts, "
          "as rank 0 profiles the model; ITERATION 0), templates (while the job starts, as the "
          "ranks build their templates; ITERATION 0)"));
    }
    e.point = parts[2];
    k.entries.push_back(std::move(e));
  }
  return k;
}

[[noreturn]] void KillSelf(int rank, int64_t iteration, const std::string& point) {
  const bool stop = point == "stop";
  TANDEM_LOG(WARNING) << "fault injection: rank " << rank << (stop ? " stops itself (SIGSTOP)" : " kills itself (SIGKILL)") << " at "
                      << point << " of iteration " << iteration
                      << (point == "checkpoint" || iteration < 0 ? "" : " (counted from 0)")
                      << " (unix time "
                      << absl::StrFormat("%.3f", absl::ToUnixMicros(absl::Now()) * 1e-6) << ")";
  ::kill(::getpid(), stop ? SIGSTOP : SIGKILL);
  for (;;) ::pause();
}

}  // namespace tandem::elastic::internal
