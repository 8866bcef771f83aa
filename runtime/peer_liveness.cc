#include "runtime/peer_liveness.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>

#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace tandem::runtime {

PeerIdentity PeerIdentity::Self() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  PeerIdentity me;
  me.pid = static_cast<int64_t>(::getpid());
  me.host = static_cast<int64_t>(std::hash<std::string>()(host) & 0x7fffffffffffffffULL);
  return me;
}

PeerLiveness::PeerLiveness(int size, int self, absl::Duration timeout,
                           bool kill_silent_local_peers, absl::Time now)
    : self_(self),
      timeout_(timeout),
      kill_(kill_silent_local_peers),
      self_identity_(PeerIdentity::Self()),
      next_heartbeat_(now),
      peers_(static_cast<size_t>(std::max(size, 0))) {
  for (Peer& p : peers_) p.last_heard = now;
  if (self >= 0 && self < size) {
    peers_[self].watched = false;
    peers_[self].identity = self_identity_;
  }
}

absl::Status PeerLiveness::ExchangeIdentities(comm::Communicator& comm) {
  if (comm.size() != static_cast<int>(peers_.size()) || comm.rank() != self_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer liveness: a communicator of ", comm.size(), " ranks (this one ", comm.rank(),
        ") for a detector of ", peers_.size(), " (this one ", self_, ")"));
  }
  int64_t mine[2] = {self_identity_.pid, self_identity_.host};
  std::vector<int64_t> all(2 * peers_.size(), -1);
  const comm::Buffer in{mine, 2, comm::DataType::kInt64, comm::Device::Cpu()};
  const comm::Buffer out{all.data(), static_cast<int64_t>(all.size()), comm::DataType::kInt64,
                         comm::Device::Cpu()};
  const absl::Status gathered = comm.AllGather(in, out)->Wait();
  if (!gathered.ok()) {
    return absl::UnavailableError(
        absl::StrCat("peer liveness: exchanging process ids: ", gathered.message()));
  }
  for (size_t r = 0; r < peers_.size(); ++r) {
    peers_[r].identity = PeerIdentity{all[2 * r], all[2 * r + 1]};
  }
  return absl::OkStatus();
}

void PeerLiveness::Heard(int peer, absl::Time now) { peers_[peer].last_heard = now; }

void PeerLiveness::Heard(int peer, absl::Time now, const PeerIdentity& identity) {
  peers_[peer].last_heard = now;
  if (identity.known()) peers_[peer].identity = identity;
}

void PeerLiveness::Unwatch(int peer) { peers_[peer].watched = false; }

bool PeerLiveness::watched(int peer) const { return peers_[peer].watched; }

bool PeerLiveness::HeartbeatDue(absl::Time now) {
  if (now < next_heartbeat_) return false;
  next_heartbeat_ = now + timeout_ / 4;
  return true;
}

int PeerLiveness::FirstSilent(absl::Time now) const {
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (peers_[r].watched && now - peers_[r].last_heard > timeout_) return static_cast<int>(r);
  }
  return -1;
}

absl::Duration PeerLiveness::SilentFor(int peer, absl::Time now) const {
  return now - peers_[peer].last_heard;
}

std::string PeerLiveness::KillIfLocal(int peer) const {
  const PeerIdentity& p = peers_[peer].identity;
  if (!kill_ || !p.known() || p.host != self_identity_.host || p.pid == self_identity_.pid) {
    return "";
  }
  if (::kill(static_cast<pid_t>(p.pid), SIGKILL) != 0) return "";
  return absl::StrCat("killed its process ", p.pid, " on this host");
}

std::vector<int64_t> KillStoppedSiblings() {
  std::vector<int64_t> killed;
  const int64_t me = static_cast<int64_t>(::getpid());
  const int64_t parent = static_cast<int64_t>(::getppid());
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return killed;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    int64_t pid = 0;
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid = std::stoll(name);
    if (pid == me) continue;
    // /proc/PID/stat: "pid (command) state ppid ...", the command possibly holding spaces.
    // Read with ReadFile, not a stream: a process that exits while it is read makes the read
    // fail (ESRCH), which libstdc++'s filebuf throws even from a stream without exceptions
    // enabled; the scan went down with it.
    const absl::StatusOr<std::string> read = ReadFile((entry.path() / "stat").string());
    if (!read.ok()) continue;
    const std::string& stat = *read;
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    int64_t ppid = 0;
    if (!(rest >> state >> ppid) || ppid != parent || state != 'T') continue;
    std::error_code unreadable;
    if (std::filesystem::read_symlink(entry.path() / "exe", unreadable) != program) continue;
    if (::kill(static_cast<pid_t>(pid), SIGKILL) == 0) killed.push_back(pid);
  }
  std::sort(killed.begin(), killed.end());
  return killed;
}

}  // namespace tandem::runtime
