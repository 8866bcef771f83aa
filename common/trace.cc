#include "common/trace.h"

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace tandem {

void ChromeTrace::NameProcess(int pid, const std::string& name) {
  process_names_.push_back({pid, 0, name});
}

void ChromeTrace::NameThread(int pid, int tid, const std::string& name) {
  thread_names_.push_back({pid, tid, name});
}

void ChromeTrace::Merge(const ChromeTrace& other, int pid_offset) {
  for (TraceEvent e : other.events_) {
    e.pid += pid_offset;
    events_.push_back(std::move(e));
  }
  for (Name n : other.process_names_) {
    n.pid += pid_offset;
    process_names_.push_back(n);
  }
  for (Name n : other.thread_names_) {
    n.pid += pid_offset;
    thread_names_.push_back(n);
  }
}

nlohmann::json ChromeTrace::ToJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const Name& n : process_names_) {
    list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", n.pid},
                    {"args", {{"name", n.name}}}});
    list.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", n.pid},
                    {"args", {{"sort_index", n.pid}}}});
  }
  for (const Name& n : thread_names_) {
    list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", n.pid}, {"tid", n.tid},
                    {"args", {{"name", n.name}}}});
  }
  for (const TraceEvent& e : events_) {
    list.push_back({{"name", e.name},
                    {"cat", e.category},
                    {"ph", "X"},
                    {"pid", e.pid},
                    {"tid", e.tid},
                    {"ts", e.start_seconds * 1e6},
                    {"dur", e.duration_seconds * 1e6},
                    {"args", e.args}});
  }
  return {{"traceEvents", list}, {"displayTimeUnit", "ms"}};
}

absl::StatusOr<ChromeTrace> ChromeTrace::FromJson(const nlohmann::json& j) {
  ChromeTrace trace;
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
    return absl::InvalidArgumentError("trace: expected an object with a traceEvents array");
  }
  for (const auto& e : j["traceEvents"]) {
    std::string ph = e.value("ph", "");
    if (ph == "M") {
      std::string kind = e.value("name", "");
      std::string name = e.contains("args") ? e["args"].value("name", "") : "";
      if (kind == "process_name") trace.NameProcess(e.value("pid", 0), name);
      if (kind == "thread_name") trace.NameThread(e.value("pid", 0), e.value("tid", 0), name);
      continue;
    }
    if (ph != "X") continue;
    TraceEvent ev;
    ev.name = e.value("name", "");
    ev.category = e.value("cat", "");
    ev.pid = e.value("pid", 0);
    ev.tid = e.value("tid", 0);
    ev.start_seconds = e.value("ts", 0.0) * 1e-6;
    ev.duration_seconds = e.value("dur", 0.0) * 1e-6;
    if (e.contains("args")) ev.args = e["args"];
    trace.Add(std::move(ev));
  }
  return trace;
}

absl::Status ChromeTrace::WriteFile(const std::string& path) const {
  return WriteFileAtomically(path, ToJson().dump());
}

}  // namespace tandem
