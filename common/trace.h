// Chrome trace ("Trace Event Format") timelines that open in Perfetto and chrome://tracing.
// Used by the simulator (predicted timelines) and the runtime (measured ones), so both can be
// opened side by side: one process per rank ("pid"), one thread per lane ("tid": compute,
// send, receive, sync).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file_util.h"
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

// Writes a Chrome trace to a file as it is made, for timelines too large to hold (a schedule of
// 10^8 actions is gigabytes of JSON; as a ChromeTrace, tens): metadata and events are
// formatted straight into an AtomicFileWriter's buffer, and the file appears at its path only
// on Close. Reads back with ChromeTrace::FromJson and opens in Perfetto.
class TraceFileWriter {
 public:
  static absl::StatusOr<TraceFileWriter> Open(const std::string& path);

  void NameProcess(int pid, absl::string_view name);
  void NameThread(int pid, int tid, absl::string_view name);
  // A complete ("X") event named `prefix` + `name`, with integer arguments.
  struct IntArg {
    const char* key;
    int64_t value;
  };
  void Complete(absl::string_view prefix, absl::string_view name, absl::string_view category,
                int pid, int tid, double start_seconds, double duration_seconds,
                absl::Span<const IntArg> args);
  // An event with arguments of any JSON type.
  void Add(const TraceEvent& event);
  // Finishes the file and renames it onto the path.
  absl::Status Close();
  int64_t bytes() const { return file_.bytes(); }

 private:
  explicit TraceFileWriter(AtomicFileWriter file) : file_(std::move(file)) {}
  // Opens the event's object up to its arguments.
  void Begin(absl::string_view prefix, absl::string_view name, absl::string_view category,
             int pid, int tid, double start_seconds, double duration_seconds);
  void Separator();

  AtomicFileWriter file_;
  bool first_ = true;
};

}  // namespace tandem
