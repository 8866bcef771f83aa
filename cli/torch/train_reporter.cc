#include "cli/torch/train_reporter.h"

#include <cmath>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::cli {
namespace {

double UnixSeconds() { return absl::ToUnixMicros(absl::Now()) * 1e-6; }

// exp(loss), or infinity past what a double holds.
double Perplexity(double loss) { return loss < 700 ? std::exp(loss) : HUGE_VAL; }

}  // namespace

absl::Status AppendLogEvent(const std::string& path, const nlohmann::json& event) {
  if (path.empty()) return absl::OkStatus();
  return AppendToFile(path, event.dump() + "\n");
}

absl::Status TrainReporter::StartLog() {
  log_known_ = true;
  last_logged_ = 0;
  if (log_json_.empty()) return absl::OkStatus();
  return WriteFileAtomically(log_json_, "");
}

absl::Status TrainReporter::ReadLoggedIterations() {
  log_known_ = true;
  if (log_json_.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFile(log_json_);
  if (!text.ok()) return absl::OkStatus();  // nothing logged yet
  if (!text->empty() && text->back() != '\n') {
    // The last reporter died while it wrote a line: that part goes, so the next line starts
    // on a line of its own.
    text->resize(text->find_last_of('\n') == std::string::npos ? 0
                                                                : text->find_last_of('\n') + 1);
    TANDEM_RETURN_IF_ERROR(Annotate(WriteFileAtomically(log_json_, *text), "--log-json"));
  }
  std::istringstream in(*text);
  std::string row;
  while (std::getline(in, row)) {
    const nlohmann::json line = nlohmann::json::parse(row, nullptr, false);
    if (line.is_object() && line.contains("iteration") && !line.contains("event") &&
        line["iteration"].is_number_integer()) {
      last_logged_ = std::max<int64_t>(last_logged_, line["iteration"].get<int64_t>());
    }
  }
  return absl::OkStatus();
}

absl::Status TrainReporter::Append(const nlohmann::json& line) {
  return Annotate(AppendLogEvent(log_json_, line), "--log-json");
}

absl::Status TrainReporter::Iteration(const ProgressLine& l) {
  std::string text = absl::StrFormat("iter %4d/%d  loss %.5f  %8.1f ms  %9.0f tokens/s",
                                     l.iteration, l.end, l.loss, l.seconds * 1e3,
                                     l.tokens_per_second);
  if (l.bubble.has_value()) absl::StrAppendFormat(&text, "  bubble %.2f", *l.bubble);
  if (l.peak_bytes.has_value()) absl::StrAppend(&text, "  peak ", FormatBytes(*l.peak_bytes));
  if (l.mfu.has_value()) absl::StrAppendFormat(&text, "  MFU %.1f%%", *l.mfu * 100);
  if (l.pipelines.has_value() && l.ranks.has_value()) {
    absl::StrAppendFormat(&text, "  %d pipeline(s) on %d rank(s)", *l.pipelines, *l.ranks);
  }
  std::cout << text << std::endl;
  if (log_json_.empty()) return absl::OkStatus();
  if (!log_known_) TANDEM_RETURN_IF_ERROR(ReadLoggedIterations());
  if (pending_event_.has_value()) {
    (*pending_event_)["first_step_after_iteration"] = l.iteration;
    (*pending_event_)["first_step_after_seconds"] = l.seconds;
    TANDEM_RETURN_IF_ERROR(Append(*pending_event_));
    pending_event_.reset();
  }
  if (l.iteration <= last_logged_) return absl::OkStatus();  // run again after a roll-back
  last_logged_ = l.iteration;
  nlohmann::json line = {{"iteration", l.iteration},
                         {"loss", l.loss},
                         {"iteration_ms", l.seconds * 1e3},
                         {"tokens_per_second", l.tokens_per_second},
                         {"grad_norm", l.grad_norm},
                         {"learning_rate", l.learning_rate}};
  if (l.bubble.has_value()) line["bubble"] = *l.bubble;
  if (l.peak_bytes.has_value()) line["peak_memory_bytes"] = *l.peak_bytes;
  if (l.mfu.has_value()) line["mfu"] = *l.mfu;
  if (l.pipelines.has_value()) line["pipelines"] = *l.pipelines;
  if (l.ranks.has_value()) line["ranks"] = *l.ranks;
  line["unix_time"] = UnixSeconds();
  return Append(line);
}

absl::Status TrainReporter::Validation(int64_t iteration, double loss) {
  // An evaluation run again after a roll-back is reported once.
  if (last_validation_iteration_.has_value() && iteration <= *last_validation_iteration_) {
    return absl::OkStatus();
  }
  last_validation_iteration_ = iteration;
  last_validation_loss_ = loss;
  std::cout << absl::StrFormat("validation after iteration %d: loss %.5f  perplexity %.3f",
                               iteration, loss, Perplexity(loss))
            << std::endl;
  nlohmann::json line = {{"event", "validation"},
                         {"iteration", iteration},
                         {"valid_loss", loss},
                         {"unix_time", UnixSeconds()}};
  if (std::isfinite(Perplexity(loss))) line["valid_perplexity"] = Perplexity(loss);
  return Append(line);
}

absl::Status TrainReporter::Checkpoint(const std::string& dir, int64_t step) {
  std::cout << "checkpoint: " << dir << " (step " << step << ")" << std::endl;
  return Append({{"event", "checkpoint"}, {"step", step}});
}

absl::Status TrainReporter::Reformation(const std::string& text, nlohmann::json event) {
  std::cout << text << std::endl;
  if (pending_event_.has_value()) TANDEM_RETURN_IF_ERROR(Append(*pending_event_));
  pending_event_ = std::move(event);
  return absl::OkStatus();
}

absl::Status TrainReporter::Finish(const RunSummary& s, nlohmann::json finished) {
  if (pending_event_.has_value()) {  // nothing ran after it
    TANDEM_RETURN_IF_ERROR(Append(*pending_event_));
    pending_event_.reset();
  }
  std::string validation;
  if (last_validation_loss_.has_value()) {
    validation = absl::StrFormat(", validation loss %.5f (perplexity %.3f)",
                                 *last_validation_loss_, Perplexity(*last_validation_loss_));
  }
  if (s.reconfigurations.has_value()) {
    std::cout << absl::StrFormat(
                     "trained to iteration %d elastically: final loss %.5f%s, %d "
                     "reconfiguration(s), %d growth(s), %s",
                     s.iterations, s.final_loss, validation, *s.reconfigurations, s.growths,
                     s.layout)
              << std::endl;
  } else if (s.mean_seconds.has_value()) {
    std::cout << absl::StrFormat(
                     "trained %d iteration(s) on %d rank(s) (to iteration %d): final loss "
                     "%.5f%s, %.1f ms per iteration, %.0f tokens/s, measured bubble %.2f, %s%s",
                     s.trained, s.ranks, s.iterations, s.final_loss, validation,
                     *s.mean_seconds * 1e3, s.tokens_per_second, s.bubble, s.memory,
                     s.mfu.has_value() ? absl::StrFormat("  MFU %.1f%%", *s.mfu * 100) : "")
              << std::endl;
  }
  if (finished.is_null()) return absl::OkStatus();
  if (last_validation_loss_.has_value()) finished["valid_loss"] = *last_validation_loss_;
  return Append(finished);
}

}  // namespace tandem::cli
