// Chrome trace ("Trace Event Format") timelines that open in Perfetto and chrome://tracing.
// Used by the simulator (predicted timelines) and the runtime (measured ones), so both can be
// opened side by side: one process per rank ("pid"), one thread per lane ("tid": compute,
// send, receive, sync).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct TraceEvent {
  std::string name;
  std::string category;  // "forward", "backward", "send", ...
  int pid = 0;           // rank
  int tid = 0;           // lane
  double start_seconds = 0;
  double duration_seconds = 0;
  nlohmann::json args = nlohmann::json::object();
};

class ChromeTrace {
 public:
  void Add(TraceEvent event) { events_.push_back(std::move(event)); }
  // Names shown for a rank ("rank 0") and a lane ("compute").
  void NameProcess(int pid, const std::string& name);
  void NameThread(int pid, int tid, const std::string& name);
  // Appends all events of `other`, shifting pids by `pid_offset` (to merge per-rank files or
  // put a prediction beside a measurement).
  void Merge(const ChromeTrace& other, int pid_offset = 0);

  const std::vector<TraceEvent>& events() const { return events_; }
  nlohmann::json ToJson() const;
  static absl::StatusOr<ChromeTrace> FromJson(const nlohmann::json& j);
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Name {
    int pid, tid;
    std::string name;
  };
  std::vector<TraceEvent> events_;
  std::vector<Name> process_names_;
  std::vector<Name> thread_names_;
};

}  // namespace tandem
