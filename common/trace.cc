#include "common/trace.h"

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"

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
  TANDEM_ASSIGN_OR_RETURN(TraceFileWriter writer, TraceFileWriter::Open(path));
  for (const Name& n : process_names_) writer.NameProcess(n.pid, n.name);
  for (const Name& n : thread_names_) writer.NameThread(n.pid, n.tid, n.name);
  for (const TraceEvent& e : events_) writer.Add(e);
  return writer.Close();
}

namespace {

// `head` + `tail` as a JSON string: quotes, backslashes and control characters escaped.
void AppendJsonString(std::string& out, absl::string_view head, absl::string_view tail = {}) {
  out += '"';
  for (const absl::string_view part : {head, tail}) {
    for (const char c : part) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            absl::StrAppend(&out, "\\u00",
                            absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
          } else {
            out += c;
          }
      }
    }
  }
  out += '"';
}

// The shortest decimal that reads back as `value` (what nlohmann::json writes); JSON has no
// infinities or NaN, so those are written as null, as nlohmann::json does.
void AppendJsonNumber(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  out.append(text, error == std::errc() ? static_cast<size_t>(end - text) : 0);
}

}  // namespace

absl::StatusOr<TraceFileWriter> TraceFileWriter::Open(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  TraceFileWriter writer(std::move(file));
  writer.file_.Append("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  return writer;
}

void TraceFileWriter::Separator() {
  if (!first_) file_.buffer() += ',';
  first_ = false;
}

void TraceFileWriter::NameProcess(int pid, absl::string_view name) {
  std::string& out = file_.buffer();
  Separator();
  absl::StrAppend(&out, "{\"args\":{\"name\":");
  AppendJsonString(out, name);
  absl::StrAppend(&out, "},\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", pid,
                  "},{\"args\":{\"sort_index\":", pid,
                  "},\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", pid, "}");
  file_.Flush();
}

void TraceFileWriter::NameThread(int pid, int tid, absl::string_view name) {
  std::string& out = file_.buffer();
  Separator();
  absl::StrAppend(&out, "{\"args\":{\"name\":");
  AppendJsonString(out, name);
  absl::StrAppend(&out, "},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid,
                  ",\"tid\":", tid, "}");
  file_.Flush();
}

void TraceFileWriter::Begin(absl::string_view prefix, absl::string_view name,
                            absl::string_view category, int pid, int tid, double start_seconds,
                            double duration_seconds) {
  std::string& out = file_.buffer();
  Separator();
  out += "{\"cat\":";
  AppendJsonString(out, category);
  out += ",\"dur\":";
  AppendJsonNumber(out, duration_seconds * 1e6);
  out += ",\"name\":";
  AppendJsonString(out, prefix, name);
  absl::StrAppend(&out, ",\"ph\":\"X\",\"pid\":", pid, ",\"tid\":", tid, ",\"ts\":");
  AppendJsonNumber(out, start_seconds * 1e6);
}

void TraceFileWriter::Complete(absl::string_view prefix, absl::string_view name,
                               absl::string_view category, int pid, int tid,
                               double start_seconds, double duration_seconds,
                               absl::Span<const IntArg> args) {
  Begin(prefix, name, category, pid, tid, start_seconds, duration_seconds);
  std::string& out = file_.buffer();
  out += ",\"args\":{";
  bool first = true;
  for (const IntArg& arg : args) {
    absl::StrAppend(&out, first ? "" : ",", "\"", arg.key, "\":", arg.value);
    first = false;
  }
  out += "}}";
  file_.Flush();
}

void TraceFileWriter::Add(const TraceEvent& e) {
  Begin("", e.name, e.category, e.pid, e.tid, e.start_seconds, e.duration_seconds);
  std::string& out = file_.buffer();
  absl::StrAppend(&out, ",\"args\":", e.args.dump(), "}");
  file_.Flush();
}

absl::Status TraceFileWriter::Close() {
  file_.Append("]}");
  return file_.Commit();
}

}  // namespace tandem
