#include "cluster/live.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cluster/internal/csv.h"
#include "cluster/internal/process.h"
#include "cluster/metrics.h"
#include "common/file_util.h"
#include "common/printable.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

namespace fs = std::filesystem;

// The environment variable that marks the ranks of one launch ("JOB.K").
constexpr char kLaunchTag[] = "TANDEM_CLUSTER_LAUNCH";

// The last line of a launch's output that reports an error ("... error: ..."), at most 300
// characters, bytes outside printable ASCII escaped; empty when there is none.
std::string LastErrorLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find("error: ") != std::string::npos) last = line;
  }
  std::string out;
  for (const char c : last.substr(0, 300)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    }
  }
  return out;
}
constexpr double kTickSeconds = 0.1;

// Flags the controller sets on every launch; a jobs file may not.
const std::vector<std::string>& ReservedFlags() {
  static const auto* flags =
      new std::vector<std::string>{"--steps",    "--global-batch", "--resume", "--checkpoint-dir",
                                   "--log-json", "--elastic",      "-np",      "-n"};
  return *flags;
}

bool HasFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (const std::string& f : flags) {
    if (f == name || absl::StartsWith(f, name + "=")) return true;
  }
  return false;
}

std::string Placement(const Allocation& allocation) {
  std::map<int, int> per_node;
  for (int node : allocation) ++per_node[node];
  std::vector<std::string> parts;
  for (const auto& [node, n] : per_node) parts.push_back(absl::StrCat(n, "@", node));
  return absl::StrJoin(parts, "+");
}

}  // namespace

absl::StatusOr<std::vector<LiveJobSpec>> ReadLiveJobs(const std::string& path, int total_slots) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  // Comment lines become blank (line numbers stay right).
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  for (std::string& line : lines) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "#")) line.clear();
  }
  TANDEM_ASSIGN_OR_RETURN(internal::CsvTable table,
                          internal::CsvTable::Parse(absl::StrJoin(lines, "\n"), path));
  std::map<std::string, int> col;
  for (const char* name : {"name", "submission_seconds", "steps", "global_batch", "min_ranks",
                           "max_ranks", "train_flags"}) {
    TANDEM_ASSIGN_OR_RETURN(col[name], table.Column(name));
  }
  std::vector<LiveJobSpec> jobs;
  std::set<std::string> names;
  for (int r = 0; r < table.rows(); ++r) {
    LiveJobSpec job;
    job.name = table.Field(r, col["name"]);
    if (job.name.empty() || !std::all_of(job.name.begin(), job.name.end(), [](char c) {
          return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
        })) {
      return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "job name '", job.name,
                                                     "' must be letters, digits, '-', '_', '.'"));
    }
    if (!names.insert(job.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(table.Where(r), "job name '", job.name, "' appears twice"));
    }
    TANDEM_ASSIGN_OR_RETURN(job.submission_seconds, table.Number(r, col["submission_seconds"]));
    TANDEM_ASSIGN_OR_RETURN(long long steps, table.Integer(r, col["steps"]));
    TANDEM_ASSIGN_OR_RETURN(long long batch, table.Integer(r, col["global_batch"]));
    TANDEM_ASSIGN_OR_RETURN(long long min_ranks, table.Integer(r, col["min_ranks"]));
    TANDEM_ASSIGN_OR_RETURN(long long max_ranks, table.Integer(r, col["max_ranks"]));
    if (!(job.submission_seconds >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(table.Where(r), "submission_seconds must not be negative"));
    }
    // A live run waits for every submission in real time: a month ahead is a mistake.
    constexpr double kLatestSubmission = 30 * 24 * 3600.0;
    if (job.submission_seconds > kLatestSubmission) {
      return absl::InvalidArgumentError(absl::StrCat(
          table.Where(r), "submission_seconds ", job.submission_seconds, " is more than 30 days (",
          kLatestSubmission, " s) after the start of a live run"));
    }
    if (steps < 1 || batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(table.Where(r), "steps and global_batch must be at least 1"));
    }
    if (min_ranks < 1 || max_ranks < min_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          table.Where(r), "need 1 <= min_ranks <= max_ranks, got ", min_ranks, " and ", max_ranks));
    }
    if (max_ranks > total_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat(table.Where(r), "job '", job.name, "' asks for up to ", max_ranks,
                       " ranks but the cluster has ", total_slots, " slot(s)"));
    }
    job.steps = steps;
    job.global_batch = batch;
    job.min_ranks = static_cast<int>(min_ranks);
    job.max_ranks = static_cast<int>(max_ranks);
    job.train_flags = absl::StrSplit(table.Field(r, col["train_flags"]), ' ', absl::SkipEmpty());
    for (const std::string& reserved : ReservedFlags()) {
      if (HasFlag(job.train_flags, reserved)) {
        return absl::InvalidArgumentError(
            absl::StrCat(table.Where(r), "train_flags may not set ", reserved,
                         " (the controller sets --elastic, -np, --steps, --global-batch, --resume, "
                         "--checkpoint-dir and --log-json)"));
      }
    }
    jobs.push_back(std::move(job));
  }
  if (jobs.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no jobs"));
  std::stable_sort(jobs.begin(), jobs.end(), [](const LiveJobSpec& a, const LiveJobSpec& b) {
    return a.submission_seconds < b.submission_seconds;
  });
  return jobs;
}

absl::StatusOr<std::vector<LiveHost>> ReadHostFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<LiveHost> hosts;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    LiveHost host;
    host.name = words[0];
    // A host name or address as mpirun takes it: letters, digits, '.', '-', '_' (and ':'
    // for IPv6), at most 253 characters.
    const bool name_ok =
        host.name.size() <= 253 &&
        std::all_of(host.name.begin(), host.name.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                 c == '_' || c == ':';
        });
    if (!name_ok) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": '",
                                                     Printable(host.name, 80),
                                                     "' is not a host name (expected 'HOST "
                                                     "slots=N', HOST of letters, digits, "
                                                     "'.', '-', '_', ':')"));
    }
    host.slots = 1;
    for (size_t i = 1; i < words.size(); ++i) {
      absl::string_view w = words[i];
      if (absl::ConsumePrefix(&w, "slots=") && absl::SimpleAtoi(w, &host.slots) && host.slots > 0) {
        continue;
      }
      if (absl::StartsWith(words[i], "max_slots=")) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected 'HOST slots=N', got '", Printable(line, 200), "'"));
    }
    for (const LiveHost& h : hosts) {
      if (h.name == host.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", number, ": host '", host.name, "' appears twice"));
      }
    }
    hosts.push_back(host);
  }
  if (hosts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no hosts"));
  return hosts;
}

ClusterView LiveClusterView(const LiveOptions& options) {
  ClusterView view;
  if (options.hosts.empty()) {
    view.nodes.push_back(NodeView{options.slots});
  } else {
    for (const LiveHost& h : options.hosts) view.nodes.push_back(NodeView{h.slots});
  }
  return view;
}

namespace {

enum class Phase { kWaiting, kRunning, kShrinking, kGrowing, kStopping, kFinished, kFailed };

// One mpirun of a job.
struct Launch {
  int index = 0;
  pid_t mpirun = -1;
  double start_seconds = 0;
  std::string log;
  std::string output;
  std::vector<int> nodes;            // node of each job rank (started ones appended)
  int launched = 0;                  // ranks mpirun started (the others the job started)
  std::set<int> killed;              // ranks the controller killed
  std::map<int, pid_t> killed_pids;  // until they have exited (they hold their slots)
  size_t log_offset = 0;
  bool iterated = false;
  int recoveries = 0;
  int growths = 0;
  bool finished = false;
  bool stopped = false;
  double finished_unix = 0;
  std::string failure;

  int live_ranks() const { return static_cast<int>(nodes.size() - killed.size()); }
  Allocation allocation() const {
    Allocation a;
    for (size_t r = 0; r < nodes.size(); ++r) {
      if (killed.count(static_cast<int>(r)) == 0) a.push_back(nodes[r]);
    }
    std::sort(a.begin(), a.end());
    return a;
  }
};

struct Job {
  const LiveJobSpec* spec = nullptr;
  Phase phase = Phase::kWaiting;
  bool submitted = false;
  std::optional<Launch> launch;
  int64_t checkpoint_step = 0;  // where the next launch resumes
  int last_ranks = 0;
  Allocation target;
  int shrink_recoveries = 0;  // launch->recoveries when the shrink is complete
  int shrink_from = 0;        // ranks before it
  int grow_growths = 0;       // launch->growths when the live grow is complete
  double grow_requested = 0;  // when it was asked for
  double attained_slot_seconds = 0;
  std::map<int64_t, int> logged;                         // iteration -> times logged
  std::map<int, std::vector<double>> iteration_seconds;  // by ranks training
  LiveJobResult result;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class Controller {
 public:
  Controller(const std::vector<LiveJobSpec>& specs, Policy& policy, const LiveOptions& options)
      : policy_(policy), options_(options), cluster_(LiveClusterView(options)) {
    for (const LiveJobSpec& s : specs) {
      Job job;
      job.spec = &s;
      job.result.name = s.name;
      job.result.submission_seconds = s.submission_seconds;
      jobs_.push_back(std::move(job));
    }
  }

  ~Controller() { KillAll(); }

  absl::StatusOr<LiveResult> Run() {
    start_ = absl::Now();
    double last_submission = 0;
    for (const Job& j : jobs_)
      last_submission = std::max(last_submission, j.spec->submission_seconds);
    double next_round = 0;
    double last_tick = 0;
    for (;;) {
      const double now = Now();
      for (Job& j : jobs_) {
        if (j.launch.has_value()) {
          j.attained_slot_seconds += (now - last_tick) * j.launch->live_ranks();
        }
      }
      last_tick = now;
      for (Job& j : jobs_) {
        if (!j.submitted && now >= j.spec->submission_seconds) {
          j.submitted = true;
          Event(j, "submit", 0, 0, "");
        }
        TANDEM_RETURN_IF_ERROR(Observe(j));
      }
      if (std::all_of(jobs_.begin(), jobs_.end(), [](const Job& j) {
            return j.phase == Phase::kFinished || j.phase == Phase::kFailed;
          })) {
        break;
      }
      if (options_.cancel != nullptr && options_.cancel->load()) {
        return absl::CancelledError("interrupted: every job stopped");
      }
      if (now > last_submission + options_.deadline_seconds) {
        return absl::DeadlineExceededError(
            absl::StrFormat("jobs unfinished %.0f s after the last submission (every job stopped)",
                            options_.deadline_seconds));
      }
      if (now >= next_round) {
        TANDEM_RETURN_IF_ERROR(Round(now));
        next_round += options_.interval_seconds;
      }
      for (Job& j : jobs_) TANDEM_RETURN_IF_ERROR(Reconcile(j));
      Account();
      std::this_thread::sleep_for(std::chrono::duration<double>(kTickSeconds));
    }
    LiveResult result;
    result.policy = policy_.name();
    result.total_slots = cluster_.total_gpus();
    result.interval_seconds = options_.interval_seconds;
    result.events = events_;
    result.rounds = rounds_;
    result.max_slots_used = max_used_;
    result.oversubscribed_steps = oversubscribed_;
    double first = -1, last = 0;
    for (Job& j : jobs_) {
      LiveJobResult& r = j.result;
      r.iterations_logged = static_cast<int64_t>(j.logged.size());
      r.duplicate_iterations = 0;
      for (const auto& [it, n] : j.logged) r.duplicate_iterations += n - 1;
      r.missing_iterations = 0;
      for (int64_t it = 1; it <= j.spec->steps; ++it)  // the logs count from 1
        r.missing_iterations += j.logged.count(it) == 0;
      for (const auto& [ranks, seconds] : j.iteration_seconds) {
        r.seconds_per_iteration[ranks] = Median(seconds);
      }
      if (first < 0 || j.spec->submission_seconds < first) first = j.spec->submission_seconds;
      if (r.finished) last = std::max(last, r.completion_seconds);
      result.jobs.push_back(r);
    }
    result.makespan_seconds = last - std::max(first, 0.0);
    return result;
  }

 private:
  double Now() const { return absl::ToDoubleSeconds(absl::Now() - start_); }
  double UnixToSeconds(double unix_seconds) const {
    return unix_seconds - absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  }

  void Event(Job& j, const std::string& kind, int from, int to, const std::string& detail) {
    LiveEvent e{Now(), j.spec->name, kind, from, to, detail};
    events_.push_back(e);
    if (options_.on_event) {
      std::string line = absl::StrFormat("[%7.2f s] %-10s %-9s", e.seconds, e.job, kind);
      if (from > 0 || to > 0) absl::StrAppend(&line, " ", from, " -> ", to, " rank(s)");
      if (!detail.empty()) absl::StrAppend(&line, "  ", detail);
      options_.on_event(line);
    }
  }

  // Slots in use per node in the controller's accounting: every rank of a launch that has not
  // exited.
  std::vector<int> Used() const {
    std::vector<int> used(cluster_.nodes.size(), 0);
    for (const Job& j : jobs_) {
      if (!j.launch.has_value()) continue;
      const Launch& l = *j.launch;
      for (size_t r = 0; r < l.nodes.size(); ++r) {
        const int rank = static_cast<int>(r);
        if (l.killed.count(rank) == 0 || l.killed_pids.count(rank) > 0) ++used[l.nodes[r]];
      }
    }
    return used;
  }

  void Account() {
    const std::vector<int> used = Used();
    int total = 0;
    bool over = false;
    for (size_t n = 0; n < used.size(); ++n) {
      total += used[n];
      over = over || used[n] > cluster_.nodes[n].gpus;
    }
    max_used_ = std::max(max_used_, total);
    if (over) ++oversubscribed_;
  }

  // Reads what the launch's log gained and whether its mpirun has ended.
  absl::Status Observe(Job& j) {
    if (!j.launch.has_value()) return absl::OkStatus();
    Launch& l = *j.launch;
    ReadLog(j);
    for (auto it = l.killed_pids.begin(); it != l.killed_pids.end();) {
      it = internal::ProcessAlive(it->second) ? std::next(it) : l.killed_pids.erase(it);
    }
    if (j.phase == Phase::kShrinking && l.recoveries >= j.shrink_recoveries &&
        l.killed_pids.empty()) {
      j.phase = Phase::kRunning;
      ++j.result.live_shrinks;
      Event(j, "recovered", j.shrink_from, l.live_ranks(),
            "the elastic layer re-formed the job live");
    }
    if (j.phase == Phase::kGrowing && l.growths >= j.grow_growths) {
      j.phase = Phase::kRunning;
      ++j.result.live_grows;
      Event(j, "grown", l.live_ranks() - 1, l.live_ranks(),
            "the elastic layer started a rank and re-formed the job live");
    } else if (j.phase == Phase::kGrowing &&
               Now() - j.grow_requested > options_.live_grow_timeout_seconds) {
      l.nodes.pop_back();  // the rank reserved for it never came
      j.phase = Phase::kRunning;
      TANDEM_RETURN_IF_ERROR(Stop(j, "grow through a checkpoint (the live grow did not happen)"));
    }
    const int exit = internal::ReapIfEnded(l.mpirun);
    if (exit < 0) return absl::OkStatus();
    ReadLog(j);
    const int ranks = l.live_ranks();
    if (l.finished && !l.stopped) {
      j.phase = Phase::kFinished;
      j.result.finished = true;
      j.result.completion_seconds = UnixToSeconds(l.finished_unix);
      j.result.jct_seconds = j.result.completion_seconds - j.spec->submission_seconds;
      Event(j, "finished", ranks, 0, absl::StrFormat("JCT %.2f s", j.result.jct_seconds));
    } else if (l.finished && l.stopped) {
      j.phase = Phase::kWaiting;
      j.last_ranks = ranks;
      // The checkpoint the job wrote (DIR/latest names its step folder); the log must reach
      // just that far.
      int64_t logged_end = 0;
      // The log counts iterations from 1: its last one is the step a checkpoint holds.
      for (const auto& [it, n] : j.logged) logged_end = std::max(logged_end, it);
      absl::StatusOr<std::string> latest = ReadFile(
          (fs::path(options_.work_dir) / j.spec->name / "checkpoints" / "latest").string());
      int64_t step = -1;
      if (latest.ok()) {
        absl::string_view name = absl::StripAsciiWhitespace(*latest);
        if (!absl::ConsumePrefix(&name, "step-") || !absl::SimpleAtoi(name, &step)) step = -1;
      }
      if (step != logged_end) {
        j.phase = Phase::kFailed;
        j.result.error = absl::StrCat("stopped, but its latest checkpoint (step ", step,
                                      ") is not where its log ends (", logged_end, ")");
        Event(j, "failed", ranks, 0, j.result.error);
      } else {
        j.checkpoint_step = step;
        Event(j, "stopped", ranks, 0, absl::StrCat("checkpoint of step ", step, " written"));
      }
    } else {
      j.phase = Phase::kFailed;
      if (!l.failure.empty()) {
        j.result.error = l.failure;
      } else {
        // The ranks' own reason, where one printed it (a bad flag, a model that does not fit).
        const std::string reason = LastErrorLine(l.output);
        j.result.error = absl::StrCat("mpirun exited (status ", exit,
                                      ") without a finished event",
                                      reason.empty() ? "" : absl::StrCat(": ", reason), "; see ",
                                      l.output);
      }
      Event(j, "failed", ranks, 0, j.result.error);
    }
    j.launch.reset();
    return absl::OkStatus();
  }

  void ReadLog(Job& j) {
    Launch& l = *j.launch;
    std::ifstream in(l.log, std::ios::binary);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(l.log_offset));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t end = chunk.rfind('\n');
    if (end == std::string::npos) return;
    l.log_offset += end + 1;
    for (absl::string_view text :
         absl::StrSplit(absl::string_view(chunk).substr(0, end), '\n', absl::SkipEmpty())) {
      const nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!line.is_object()) continue;
      if (line.contains("event")) {
        const std::string event = line["event"].get<std::string>();
        if (event == "recovery") ++l.recoveries;
        if (event == "growth") ++l.growths;
        if (event == "finished") {
          l.finished = true;
          l.stopped = line.value("stopped", false);
          l.finished_unix =
              line.value("unix_time", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
        }
        if (event == "failed" && l.failure.empty()) {
          l.failure = absl::StrCat("rank ", line.value("rank", -1), ": ",
                                   line.value("error", std::string("failed")));
        }
        continue;
      }
      if (!line.contains("iteration")) continue;
      const int64_t it = line["iteration"].get<int64_t>();
      ++j.logged[it];
      j.iteration_seconds[line.value("ranks", 0)].push_back(line.value("iteration_ms", 0.0) / 1e3);
      if (!l.iterated) {
        l.iterated = true;
        j.result.launch_overheads.push_back(Now() - l.start_seconds);
      }
    }
  }

  absl::Status Round(double now) {
    ++rounds_;
    std::vector<JobView> views;
    Allocations current;
    std::vector<double> known;
    for (const Job& j : jobs_) {
      for (const auto& [ranks, seconds] : j.iteration_seconds) {
        known.push_back(Median(seconds) * ranks / j.spec->max_ranks);
      }
    }
    const double default_seconds = known.empty() ? 1.0 : Median(known);
    for (Job& j : jobs_) {
      if (!j.submitted || j.phase == Phase::kFinished || j.phase == Phase::kFailed) continue;
      const LiveJobSpec& s = *j.spec;
      JobView v;
      v.name = s.name;
      v.submission_seconds = s.submission_seconds;
      v.age_seconds = now - s.submission_seconds;
      v.attained_service_gpu_seconds = j.attained_slot_seconds;
      v.restarts = std::max(0, j.result.launches - 1);
      v.requested_replicas = s.max_ranks;
      v.requested_batch_size = static_cast<int>(s.global_batch);
      v.min_replicas = s.min_ranks;
      v.max_replicas = s.max_ranks;
      // Linear scaling up to max_ranks, as the simulator's fixed-duration jobs: seconds per
      // iteration at max_ranks from the rank-seconds measured so far (else the others' median).
      double rank_seconds = 0;
      int counts = 0;
      for (const auto& [ranks, seconds] : j.iteration_seconds) {
        if (ranks <= 0) continue;
        rank_seconds += Median(seconds) * ranks;
        ++counts;
      }
      const double at_max = counts > 0 ? rank_seconds / counts / s.max_ranks : default_seconds;
      const int max_ranks = s.max_ranks;
      v.speedup = [max_ranks](int nodes, int replicas) {
        return nodes > 0 ? static_cast<double>(std::min(replicas, max_ranks)) : 0.0;
      };
      v.iteration_seconds = [max_ranks](int replicas) {
        return static_cast<double>(max_ranks) / std::min(std::max(replicas, 1), max_ranks);
      };
      const int64_t done = static_cast<int64_t>(j.logged.size());
      v.remaining_iterations = static_cast<double>(std::max<int64_t>(s.steps - done, 1)) * at_max;
      views.push_back(std::move(v));
      if (j.launch.has_value()) current[s.name] = j.launch->allocation();
    }
    if (views.empty()) return absl::OkStatus();
    TANDEM_ASSIGN_OR_RETURN(Allocations next, policy_.Optimize(views, cluster_, current, now));
    TANDEM_RETURN_IF_ERROR(ValidateAllocations(next, views, cluster_, policy_.name()));
    for (Job& j : jobs_) {
      auto found = next.find(j.spec->name);
      Allocation target = found == next.end() ? Allocation() : found->second;
      std::sort(target.begin(), target.end());
      if (static_cast<int>(target.size()) < j.spec->min_ranks) target.clear();
      j.target = std::move(target);
    }
    return absl::OkStatus();
  }

  // One step of the job towards its target, when it is not in the middle of a change.
  absl::Status Reconcile(Job& j) {
    if (!j.submitted) return absl::OkStatus();
    switch (j.phase) {
      case Phase::kWaiting:
        if (!j.target.empty() && Fits(j.target)) return Start(j);
        return absl::OkStatus();
      case Phase::kRunning:
        break;
      default:
        return absl::OkStatus();
    }
    Launch& l = *j.launch;
    if (!l.iterated) return absl::OkStatus();  // its handlers are installed once it iterates
    const Allocation now = l.allocation();
    if (j.target == now) return absl::OkStatus();
    if (j.target.empty()) return Stop(j, "preempted");
    if (j.target.size() > now.size() && IsSubset(now, j.target) && options_.live_grow &&
        cluster_.nodes.size() == 1 && FreeSlots(0) > 0) {
      // Live grow by one rank; the next one once it has joined.
      ::kill(l.mpirun, SIGUSR2);  // mpirun forwards it to every rank
      l.nodes.push_back(0);       // its slot, from now on
      j.phase = Phase::kGrowing;
      j.grow_growths = l.growths + 1;
      j.grow_requested = Now();
      Event(j, "grow", l.live_ranks() - 1, l.live_ranks(),
            absl::StrCat("SIGUSR2: one more rank, started by the job (target ",
                         j.target.size(), ")"));
      return absl::OkStatus();
    }
    if (j.target.size() < now.size() && IsSubset(j.target, now)) {
      // Live shrink: the highest ranks on each node that loses slots, among the processes
      // mpirun started (those the job started cannot be told apart by their rank).
      const std::map<int, pid_t> pids =
          internal::ProcessesTagged(kLaunchTag, LaunchTag(j, l), "OMPI_COMM_WORLD_RANK");
      std::map<int, int> remove;
      for (int node : now) ++remove[node];
      for (int node : j.target) --remove[node];
      std::vector<int> victims;
      for (int r = l.launched - 1; r >= 0; --r) {
        if (l.killed.count(r) > 0 || remove[l.nodes[r]] <= 0 || pids.count(r) == 0) continue;
        --remove[l.nodes[r]];
        victims.push_back(r);
      }
      const bool all_here = std::all_of(remove.begin(), remove.end(),
                                        [](const auto& node) { return node.second <= 0; });
      if (!all_here) return Stop(j, "shrink through a checkpoint (ranks not on this host)");
      const int from = l.live_ranks();
      for (int r : victims) {
        ::kill(pids.at(r), SIGKILL);
        l.killed.insert(r);
        l.killed_pids[r] = pids.at(r);
      }
      j.phase = Phase::kShrinking;
      j.shrink_recoveries = l.recoveries + 1;
      j.shrink_from = from;
      Event(j, "shrink", from, l.live_ranks(),
            absl::StrCat("SIGKILL to rank(s) ", absl::StrJoin(victims, ", ")));
      return absl::OkStatus();
    }
    return Stop(j, j.target.size() > now.size() ? "grow through a checkpoint"
                                                : "move through a checkpoint");
  }

  static bool IsSubset(const Allocation& small, const Allocation& big) {
    std::map<int, int> held;
    for (int node : big) ++held[node];
    for (int node : small) {
      if (--held[node] < 0) return false;
    }
    return true;
  }

  int FreeSlots(int node) const { return cluster_.nodes[node].gpus - Used()[node]; }

  bool Fits(const Allocation& target) const {
    std::vector<int> free = Used();
    for (size_t n = 0; n < free.size(); ++n) free[n] = cluster_.nodes[n].gpus - free[n];
    for (int node : target) {
      if (--free[node] < 0) return false;
    }
    return true;
  }

  static std::string LaunchTag(const Job& j, const Launch& l) {
    return absl::StrCat(j.spec->name, ".", l.index);
  }

  absl::Status Stop(Job& j, const std::string& why) {
    ::kill(j.launch->mpirun, SIGUSR1);  // mpirun forwards it to every rank
    j.phase = Phase::kStopping;
    Event(j, "stop", j.launch->live_ranks(), static_cast<int>(j.target.size()),
          absl::StrCat("SIGUSR1: ", why));
    return absl::OkStatus();
  }

  absl::Status Start(Job& j) {
    const LiveJobSpec& s = *j.spec;
    const fs::path dir = fs::path(options_.work_dir) / s.name;
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("creating ", dir.string(), ": ", error.message()));
    }
    Launch l;
    l.index = j.result.launches;
    l.log = (dir / absl::StrCat("launch-", l.index, ".jsonl")).string();
    l.output = (dir / absl::StrCat("launch-", l.index, ".out")).string();
    fs::remove(l.log, error);
    const std::string checkpoints = (dir / "checkpoints").string();
    // Ranks by node in node order: mpirun maps ranks to the --host list by slot.
    l.nodes = j.target;
    const int n = static_cast<int>(l.nodes.size());
    l.launched = n;
    std::vector<std::string> argv = {options_.mpirun, "--enable-recovery", "--oversubscribe",
                                     "--bind-to", "none"};
    if (!options_.hosts.empty()) {
      std::map<int, int> per_node;
      for (int node : l.nodes) ++per_node[node];
      std::vector<std::string> hosts;
      for (const auto& [node, count] : per_node) {
        hosts.push_back(absl::StrCat(options_.hosts[node].name, ":", count));
      }
      argv.insert(argv.end(), {"--host", absl::StrJoin(hosts, ",")});
    }
    argv.insert(argv.end(), {"-np", absl::StrCat(n), "-x", kLaunchTag});
    argv.insert(argv.end(), options_.mpirun_flags.begin(), options_.mpirun_flags.end());
    argv.insert(argv.end(), {options_.tandem_program, "train", "--elastic"});
    argv.insert(argv.end(), s.train_flags.begin(), s.train_flags.end());
    // Any rank count down to one pipeline (the default, 2, refuses one rank and a shrink to it).
    if (!HasFlag(s.train_flags, "--elastic-min-pipelines")) {
      argv.insert(argv.end(), {"--elastic-min-pipelines", "1"});
    }
    argv.insert(argv.end(), {"--global-batch", absl::StrCat(s.global_batch), "--steps",
                             absl::StrCat(s.steps), "--checkpoint-dir",
                             checkpoints, "--log-json", l.log});
    if (j.checkpoint_step > 0) argv.insert(argv.end(), {"--resume", checkpoints});
    { std::ofstream(l.output, std::ios::app) << "$ " << absl::StrJoin(argv, " ") << "\n"; }
    TANDEM_ASSIGN_OR_RETURN(l.mpirun,
                            internal::Spawn(argv, {{kLaunchTag, LaunchTag(j, l)}}, l.output));
    // A scheduler killed outright (SIGKILL) must not leave the job training.
    TANDEM_RETURN_IF_ERROR(internal::EndWithThisProcess(l.mpirun));
    l.start_seconds = Now();
    const int from = j.last_ranks;
    const bool resumed = j.checkpoint_step > 0;
    if (resumed && n > from) ++j.result.grows;
    if (j.result.launches > 0) ++j.result.restarts;
    ++j.result.launches;
    j.last_ranks = n;
    j.launch = std::move(l);
    j.phase = Phase::kRunning;
    Event(j, "start", from, n,
          absl::StrCat(resumed ? absl::StrCat("--resume at step ", j.checkpoint_step, ", ") : "",
                       "slots ", Placement(j.target)));
    return absl::OkStatus();
  }

  void KillAll() {
    for (Job& j : jobs_) {
      if (!j.launch.has_value()) continue;
      for (pid_t pid : internal::AllProcessesTagged(kLaunchTag, LaunchTag(j, *j.launch))) {
        ::kill(pid, SIGKILL);
      }
      ::kill(-j.launch->mpirun, SIGKILL);
      for (int i = 0; i < 50 && internal::ReapIfEnded(j.launch->mpirun) < 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      j.launch.reset();
    }
  }

  Policy& policy_;
  const LiveOptions& options_;
  ClusterView cluster_;
  std::vector<Job> jobs_;
  std::vector<LiveEvent> events_;
  absl::Time start_;
  int rounds_ = 0;
  int max_used_ = 0;
  int oversubscribed_ = 0;
};

}  // namespace

absl::StatusOr<LiveResult> RunLiveCluster(const std::vector<LiveJobSpec>& jobs, Policy& policy,
                                          const LiveOptions& options) {
  const ClusterView cluster = LiveClusterView(options);
  if (cluster.total_gpus() < 1) {
    return absl::InvalidArgumentError("the cluster has no slots");
  }
  if (!(options.interval_seconds > 0)) {
    return absl::InvalidArgumentError("the scheduling interval must be positive");
  }
  std::error_code error;
  if (options.tandem_program.empty() || !fs::exists(options.tandem_program, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no tandem program at '", options.tandem_program, "'"));
  }
  for (const LiveJobSpec& j : jobs) {
    if (j.max_ranks > cluster.total_gpus()) {
      return absl::InvalidArgumentError(absl::StrCat("job '", j.name, "' asks for up to ",
                                                     j.max_ranks, " ranks but the cluster has ",
                                                     cluster.total_gpus(), " slot(s)"));
    }
  }
  Controller controller(jobs, policy, options);
  return controller.Run();
}

absl::StatusOr<LivePrediction> PredictLiveRun(const std::vector<LiveJobSpec>& jobs,
                                              const LiveResult& live, Policy& policy,
                                              const ClusterView& cluster) {
  LivePrediction prediction;
  std::vector<double> overheads;
  for (const LiveJobResult& r : live.jobs) {
    overheads.insert(overheads.end(), r.launch_overheads.begin(), r.launch_overheads.end());
  }
  double sum = 0;
  for (double o : overheads) sum += o;
  prediction.restart_seconds = overheads.empty() ? 0 : sum / overheads.size();
  Workload workload;
  workload.source = "live run";
  for (const LiveJobSpec& spec : jobs) {
    const LiveJobResult* r = nullptr;
    for (const LiveJobResult& candidate : live.jobs) {
      if (candidate.name == spec.name) r = &candidate;
    }
    if (r == nullptr || r->seconds_per_iteration.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", spec.name, "' has no measured iteration: nothing to predict from"));
    }
    double rank_seconds = 0;
    for (const auto& [ranks, seconds] : r->seconds_per_iteration) rank_seconds += seconds * ranks;
    rank_seconds /= r->seconds_per_iteration.size();
    WorkloadJob w;
    w.name = spec.name;
    w.submission_seconds = spec.submission_seconds;
    w.num_replicas = spec.max_ranks;
    w.duration_seconds = std::max(1e-3, spec.steps * rank_seconds / spec.max_ranks);
    prediction.duration_seconds[spec.name] = w.duration_seconds;
    workload.jobs.push_back(w);
  }
  SimulationOptions options;
  options.interval_seconds = live.interval_seconds;
  options.restart_seconds = prediction.restart_seconds;
  options.record_timeline = false;
  TANDEM_ASSIGN_OR_RETURN(prediction.simulation,
                          Simulate(workload, ApplicationCatalog(), cluster, policy, options));
  return prediction;
}

namespace {

const JobOutcome* Predicted(const LivePrediction* p, const std::string& name) {
  if (p == nullptr) return nullptr;
  for (const JobOutcome& o : p->simulation.jobs) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

}  // namespace

std::string FormatLiveResult(const LiveResult& live, const LivePrediction* prediction) {
  std::string out = absl::StrFormat(
      "policy %s on %d slot(s), interval %g s: %d job(s), %d round(s)\n", live.policy,
      live.total_slots, live.interval_seconds, live.jobs.size(), live.rounds);
  absl::StrAppendFormat(&out, "%-12s %8s %10s %10s %8s %7s %10s %11s\n", "job", "submit",
                        "JCT real", "JCT sim", "launches", "shrinks", "grows", "iterations");
  double real_sum = 0, sim_sum = 0;
  int real_n = 0, sim_n = 0;
  for (const LiveJobResult& r : live.jobs) {
    const JobOutcome* p = Predicted(prediction, r.name);
    const std::string real =
        r.finished ? absl::StrFormat("%.2f s", r.jct_seconds) : std::string("failed");
    const std::string sim = p != nullptr ? absl::StrFormat("%.2f s", p->jct_seconds) : "-";
    absl::StrAppendFormat(&out, "%-12s %8.1f %10s %10s %8d %7d %10s %11s\n", r.name,
                          r.submission_seconds, real, sim, r.launches, r.live_shrinks,
                          absl::StrCat(r.live_grows, " live, ", r.grows),
                          absl::StrCat(r.iterations_logged,
                                       r.duplicate_iterations > 0
                                           ? absl::StrCat(" (", r.duplicate_iterations, " twice)")
                                           : ""));
    if (r.finished) {
      real_sum += r.jct_seconds;
      ++real_n;
    }
    if (p != nullptr) {
      sim_sum += p->jct_seconds;
      ++sim_n;
    }
    if (!r.error.empty()) absl::StrAppend(&out, "  ", r.name, ": ", r.error, "\n");
  }
  if (real_n > 0) {
    absl::StrAppendFormat(&out, "average JCT   real %.2f s", real_sum / real_n);
    if (sim_n > 0) {
      const double sim = sim_sum / sim_n;
      absl::StrAppendFormat(&out, "   simulated %.2f s (%+.0f%%)", sim,
                            100 * (sim / (real_sum / real_n) - 1));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppendFormat(&out, "makespan      real %.2f s", live.makespan_seconds);
  if (prediction != nullptr) {
    const ClusterMetrics m = ComputeMetrics(prediction->simulation);
    absl::StrAppendFormat(&out, "   simulated %.2f s", m.makespan_seconds);
  }
  absl::StrAppendFormat(
      &out, "\nslots: at most %d of %d in use (the controller's accounting), %s\n",
      live.max_slots_used, live.total_slots,
      live.oversubscribed_steps == 0
          ? "never oversubscribed"
          : absl::StrCat("OVERSUBSCRIBED in ", live.oversubscribed_steps, " step(s)"));
  if (prediction != nullptr) {
    absl::StrAppendFormat(
        &out,
        "simulated: fixed-duration jobs scaling linearly up to max_ranks, durations from the "
        "measured rank-seconds per iteration, restart %.2f s (mean measured launch overhead)\n",
        prediction->restart_seconds);
  }
  return out;
}

nlohmann::json LiveResultToJson(const LiveResult& live, const LivePrediction* prediction) {
  nlohmann::json j;
  j["policy"] = live.policy;
  j["slots"] = live.total_slots;
  j["interval_seconds"] = live.interval_seconds;
  j["rounds"] = live.rounds;
  j["max_slots_used"] = live.max_slots_used;
  j["oversubscribed_steps"] = live.oversubscribed_steps;
  j["makespan_seconds"] = live.makespan_seconds;
  nlohmann::json jobs = nlohmann::json::array();
  double real_sum = 0;
  int real_n = 0;
  for (const LiveJobResult& r : live.jobs) {
    nlohmann::json o = {{"name", r.name},
                        {"submission_seconds", r.submission_seconds},
                        {"finished", r.finished},
                        {"completion_seconds", r.completion_seconds},
                        {"jct_seconds", r.jct_seconds},
                        {"launches", r.launches},
                        {"restarts", r.restarts},
                        {"live_shrinks", r.live_shrinks},
                        {"live_grows", r.live_grows},
                        {"grows", r.grows},
                        {"iterations_logged", r.iterations_logged},
                        {"duplicate_iterations", r.duplicate_iterations},
                        {"missing_iterations", r.missing_iterations},
                        {"launch_overheads_seconds", r.launch_overheads}};
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [ranks, s] : r.seconds_per_iteration) per[std::to_string(ranks)] = s;
    o["seconds_per_iteration_by_ranks"] = per;
    if (!r.error.empty()) o["error"] = r.error;
    if (const JobOutcome* p = Predicted(prediction, r.name)) {
      o["predicted_jct_seconds"] = p->jct_seconds;
      o["predicted_duration_seconds"] = prediction->duration_seconds.at(r.name);
    }
    if (r.finished) {
      real_sum += r.jct_seconds;
      ++real_n;
    }
    jobs.push_back(o);
  }
  j["jobs"] = jobs;
  j["avg_jct_seconds"] = real_n > 0 ? real_sum / real_n : 0.0;
  if (prediction != nullptr) {
    const ClusterMetrics m = ComputeMetrics(prediction->simulation);
    j["predicted_avg_jct_seconds"] = m.avg_jct_seconds;
    j["predicted_makespan_seconds"] = m.makespan_seconds;
    j["prediction_restart_seconds"] = prediction->restart_seconds;
    j["prediction_model"] =
        "fixed-duration jobs scaling linearly up to max_ranks; durations from measured "
        "rank-seconds per iteration; restart = mean measured launch overhead";
  }
  nlohmann::json events = nlohmann::json::array();
  for (const LiveEvent& e : live.events) {
    events.push_back({{"seconds", e.seconds},
                      {"job", e.job},
                      {"kind", e.kind},
                      {"from_ranks", e.from_ranks},
                      {"to_ranks", e.to_ranks},
                      {"detail", e.detail}});
  }
  j["events"] = events;
  return j;
}

}  // namespace tandem::cluster
