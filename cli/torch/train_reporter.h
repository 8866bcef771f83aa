// What `tandem train` tells its user, plain and elastic alike: the progress line of each
// iteration, the append-only JSON log (one object per iteration, events beside them),
// validation, checkpoint and re-formation lines, and the summary. Iterations are counted from 1
// everywhere (the progress line, the log and the checkpoints' step numbers agree).
//
// One rank reports (the plain run's rank 0; in an elastic job the first rank of the first
// pipeline, which may change after a failure): only it calls the methods below but
// AppendLogEvent, which any rank may call (a rank's failure). Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {

// One iteration as the progress line and the log show it.
struct ProgressLine {
  int64_t iteration = 0;  // counted from 1
  int64_t end = 0;        // the run's last iteration
  double loss = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  // What a run knows beyond those (the plain run: bubble, peak memory, MFU; an elastic job:
  // its pipelines and ranks).
  std::optional<double> bubble;
  std::optional<double> peak_bytes;
  std::optional<double> mfu;
  std::optional<int> pipelines;
  std::optional<int> ranks;
};

// The run's end, for the summary line.
struct RunSummary {
  int64_t iterations = 0;  // the last iteration trained, counted from 1
  int64_t trained = 0;     // iterations this run trained (a resumed run: fewer)
  int ranks = 0;
  double final_loss = 0;
  // The plain run: mean iteration over the measured ones, and what goes with it.
  std::optional<double> mean_seconds;
  double tokens_per_second = 0;
  double bubble = 0;
  std::string memory;  // "peak host memory 1.2 GiB (rank 0)"
  std::optional<double> mfu;
  // An elastic job.
  std::optional<int> reconfigurations;
  int growths = 0;
  std::string layout;
};

// Appends `event` (an object with "event") to the log at `path` as one line; "" does nothing.
// Any rank may call it (a failing rank logs its failure).
absl::Status AppendLogEvent(const std::string& path, const nlohmann::json& event);

class TrainReporter {
 public:
  // `log_json`: the JSON log ("" for none).
  explicit TrainReporter(std::string log_json) : log_json_(std::move(log_json)) {}

  // The run's first reporter starts the log empty. A reporter that takes over from a dead one
  // does not call it: at its first line it reads the iterations the log holds already.
  absl::Status StartLog();
  // This rank does not report now (another one logs): should it report again later, it reads
  // the log first (a rank that reported before a growth, then again after the started rank
  // that took over died, logged an iteration twice).
  void StopReporting() { log_known_ = false; }

  // Prints the progress line and logs the iteration, unless the log holds it already (an
  // iteration run again after a roll-back). A pending event (Reformation) is written first,
  // with this iteration as the first after it.
  absl::Status Iteration(const ProgressLine& line);
  // Validation loss (and perplexity) after iteration `iteration`.
  absl::Status Validation(int64_t iteration, double loss);
  absl::Status Checkpoint(const std::string& dir, int64_t step);
  // A recovery or growth: its line now, its event once the first iteration after it has
  // completed (or at Finish, if none did).
  absl::Status Reformation(const std::string& text, nlohmann::json event);
  // The summary line, and the "finished" event of an elastic job (`finished` not null).
  absl::Status Finish(const RunSummary& summary, nlohmann::json finished);

  std::optional<double> last_validation_loss() const { return last_validation_loss_; }

 private:
  absl::Status Append(const nlohmann::json& line);
  absl::Status ReadLoggedIterations();

  std::string log_json_;
  bool log_known_ = false;   // the iterations the log holds are known (started or read)
  int64_t last_logged_ = 0;  // the last iteration in the log
  std::optional<nlohmann::json> pending_event_;
  std::optional<double> last_validation_loss_;
  std::optional<int64_t> last_validation_iteration_;
};

}  // namespace tandem::cli
