// Settings of the communication layer, and the environment variables that override them.
//
// Environment (read by CommOptions::FromEnvironment; listed by DescribeCommEnvironment):
//   TANDEM_COMM_TIMEOUT        default Work::Wait() timeout: an absl duration ("300s", "2m")
//                              or plain seconds ("30"). Default 300s.
//   TANDEM_COMM_VERIFY         1/0: check before every collective that all ranks of the group
//                              call the same operation with the same count, type, reduction
//                              and root (one small extra all-reduce). Default 0: a debug
//                              check, off on the hot path.
//   TANDEM_COMM_WATCHDOG       NCCL watchdog polling interval (duration). Default 100ms.
//   TANDEM_COMM_WAIT           how threads wait for MPI progress: spin (lowest latency, one
//                              core per waiting thread), sleep (polls with growing pauses:
//                              for more ranks than cores) or auto (sleep when the node runs
//                              more ranks than it has cores, else spin). Default auto.
//   TANDEM_COMM_SHARED_GPU     how ranks that share one GPU carry device buffers: auto (NCCL
//                              in its multi-rank mode where the NCCL loaded at run time is
//                              2.30 or newer, else MPI through pinned host staging), nccl
//                              (the multi-rank mode; an error with an older NCCL) or mpi (host
//                              staging). Default auto.
//   TANDEM_COMM_NCCL_LINKS     1/0: NCCL point-to-point transfers with the peers a rank
//                              declares (Communicator::ConnectPeers) on a communicator and
//                              stream per ordered pair (1), or all on the group's one
//                              communicator (0: two ranks that each send to the other before
//                              receiving deadlock there). Default 1.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::comm {

inline constexpr absl::Duration kDefaultCommTimeout = absl::Seconds(300);
inline constexpr absl::Duration kDefaultWatchdogInterval = absl::Milliseconds(100);

enum class WaitMode : uint8_t { kAuto, kSpin, kSleep };

// How ranks that share a GPU carry device buffers (TANDEM_COMM_SHARED_GPU).
enum class SharedGpuMode : uint8_t {
  kAuto,  // NCCL's multi-rank mode where the NCCL loaded is >= 2.30, else kMpi
  kNccl,  // NCCL's multi-rank mode, or an error naming the NCCL loaded
  kMpi,   // MPI through pinned host staging (comm/host_staged.h)
};
// "auto", "nccl", "mpi".
const char* SharedGpuModeName(SharedGpuMode mode);

struct CommOptions {
  // Default for Work::Wait() and for the blocking steps of Split/Shrink.
  absl::Duration timeout = kDefaultCommTimeout;
  // Detect mismatched collectives (count, type, operation, root) across ranks before they run,
  // returning InvalidArgument on every rank instead of corrupting memory or hanging. A debug
  // mode (as c10d's TORCH_DISTRIBUTED_DEBUG): it costs a small all-reduce per collective, so
  // it is off unless asked for (TANDEM_COMM_VERIFY=1).
  bool verify_collectives = false;
  // NCCL: how often the watchdog polls ncclCommGetAsyncError and pending operations.
  absl::Duration watchdog_interval = kDefaultWatchdogInterval;
  // NCCL: the CUDA device of this rank (-1: local rank modulo the device count).
  int cuda_device = -1;
  // MPI: how waiting threads and the progress thread poll (process-wide; the last
  // communicator created sets it).
  WaitMode wait_mode = WaitMode::kAuto;
  // Ranks that share a GPU: NCCL's multi-rank mode or MPI host staging.
  SharedGpuMode shared_gpu = SharedGpuMode::kAuto;
  // NCCL: ConnectPeers makes a communicator per ordered pair (false: it does nothing).
  bool nccl_pair_links = true;

  // Defaults overridden by the TANDEM_COMM_* variables above. InvalidArgument names the
  // variable and its bad value.
  static absl::StatusOr<CommOptions> FromEnvironment();
};

// One line per variable: name, current value (or "unset"), default, description.
std::string DescribeCommEnvironment();

// Parses "300s", "1.5m", "250ms" or plain seconds ("30"); positive and finite.
absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text);

}  // namespace tandem::comm
