#include "cluster/application.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/internal/csv.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

using internal::CsvTable;

// Linear weight of `x` between `lo` and `hi` (0 at lo).
double Weight(double x, double lo, double hi) { return hi > lo ? (x - lo) / (hi - lo) : 0.0; }

StepTimes Mix(const StepTimes& a, const StepTimes& b, double weight) {
  return {a.step_seconds + (b.step_seconds - a.step_seconds) * weight,
          a.sync_seconds + (b.sync_seconds - a.sync_seconds) * weight};
}

}  // namespace

ApplicationLimits PolluxLimits(const std::string& name) {
  ApplicationLimits limits;
  if (name == "bert") limits.max_epochs = 2;
  if (name == "cifar10") limits.max_epochs = 100;
  if (name == "ncf") limits.max_epochs = 10;
  if (name == "imagenet") limits.max_epochs = 90;
  if (name == "deepspeech2") limits.max_epochs = 80;
  if (name == "yolov3") {
    limits.max_epochs = 50;
    limits.max_local_bsz = 8;
  }
  return limits;
}

std::vector<int> NormalisePlacement(const std::vector<int>& placement) {
  std::vector<int> kept;
  for (int gpus : placement) {
    if (gpus > 0) kept.push_back(gpus);
  }
  std::vector<int> best = kept;
  for (size_t shift = 1; shift < kept.size(); ++shift) {
    std::vector<int> rotated(kept.begin() + shift, kept.end());
    rotated.insert(rotated.end(), kept.begin(), kept.begin() + shift);
    if (rotated < best) best = std::move(rotated);
  }
  return best;
}

absl::StatusOr<std::shared_ptr<const Application>> Application::Load(
    const std::string& directory, const ApplicationLimits& limits) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("application traces: ", directory, " is not a directory"));
  }
  std::shared_ptr<Application> app(new Application());
  app->name_ = fs::path(directory).lexically_normal().filename().string();
  if (app->name_.empty()) app->name_ = fs::path(directory).parent_path().filename().string();

  // Validation tables, one per batch size.
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    const std::string file = entry.path().filename().string();
    if (!absl::StartsWith(file, "validation-") || !absl::EndsWith(file, ".csv")) continue;
    const std::string number = file.substr(11, file.size() - 15);
    int batch_size = 0;
    if (!absl::SimpleAtoi(number, &batch_size) || batch_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry.path().string(), ": expected validation-<batch size>.csv"));
    }
    TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(entry.path().string()));
    TANDEM_ASSIGN_OR_RETURN(
        std::vector<int> col,
        table.Columns({"progress", "iteration", "metric", "grad_sqr", "grad_var"}));
    std::vector<ValidationRow> rows;
    for (int r = 0; r < table.rows(); ++r) {
      ValidationRow row;
      TANDEM_ASSIGN_OR_RETURN(row.progress, table.Number(r, col[0]));
      TANDEM_ASSIGN_OR_RETURN(row.iteration, table.Number(r, col[1]));
      TANDEM_ASSIGN_OR_RETURN(row.metric, table.Number(r, col[2]));
      TANDEM_ASSIGN_OR_RETURN(row.grad_sqr, table.Number(r, col[3]));
      TANDEM_ASSIGN_OR_RETURN(row.grad_var, table.Number(r, col[4]));
      rows.push_back(row);
    }
    if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(table.path(), ": no rows"));
    app->validation_[batch_size] = std::move(rows);
  }
  if (app->validation_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(directory, ": no validation-<batch size>.csv tables"));
  }

  // Measured placements, grouped by their normalised form.
  std::map<std::vector<int>, std::map<double, std::vector<Sample>>> by_placement;
  // Grid points (nodes, replicas, local batch) -> samples to average.
  std::map<std::pair<int, int>, std::map<double, std::vector<Sample>>> grid_points;
  {
    const std::string path = (fs::path(directory) / "placements.csv").string();
    TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
    TANDEM_ASSIGN_OR_RETURN(std::vector<int> col,
                            table.Columns({"placement", "local_bsz", "step_time", "sync_time"}));
    for (int r = 0; r < table.rows(); ++r) {
      const std::string& digits = table.Field(r, col[0]);
      std::vector<int> placement;
      for (char c : digits) {
        if (c < '1' || c > '9') {
          return absl::InvalidArgumentError(absl::StrCat(
              table.Where(r), "placement '", digits, "': expected GPUs per node as digits 1-9"));
        }
        placement.push_back(c - '0');
      }
      if (placement.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "empty placement"));
      }
      Sample sample;
      TANDEM_ASSIGN_OR_RETURN(sample.local_bsz, table.Number(r, col[1]));
      TANDEM_ASSIGN_OR_RETURN(sample.step_seconds, table.Number(r, col[2]));
      TANDEM_ASSIGN_OR_RETURN(sample.sync_seconds, table.Number(r, col[3]));
      if (sample.local_bsz <= 0 || sample.step_seconds <= 0 || sample.sync_seconds < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(table.Where(r), "local_bsz and step_time must be positive"));
      }
      int replicas = 0;
      for (int gpus : placement) replicas += gpus;
      by_placement[NormalisePlacement(placement)][sample.local_bsz].push_back(sample);
      grid_points[{static_cast<int>(placement.size()), replicas}][sample.local_bsz].push_back(
          sample);
    }
    if (table.rows() == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no rows"));
  }
  {
    const std::string path = (fs::path(directory) / "scalability.csv").string();
    TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
    TANDEM_ASSIGN_OR_RETURN(
        std::vector<int> col,
        table.Columns({"num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"}));
    for (int r = 0; r < table.rows(); ++r) {
      TANDEM_ASSIGN_OR_RETURN(long long nodes, table.Integer(r, col[0]));
      TANDEM_ASSIGN_OR_RETURN(long long replicas, table.Integer(r, col[1]));
      Sample sample;
      TANDEM_ASSIGN_OR_RETURN(sample.local_bsz, table.Number(r, col[2]));
      TANDEM_ASSIGN_OR_RETURN(sample.step_seconds, table.Number(r, col[3]));
      TANDEM_ASSIGN_OR_RETURN(sample.sync_seconds, table.Number(r, col[4]));
      if (nodes < 1 || replicas < nodes || sample.local_bsz <= 0 || sample.step_seconds <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            table.Where(r), "need 1 <= num_nodes <= num_replicas and positive times"));
      }
      grid_points[{static_cast<int>(nodes), static_cast<int>(replicas)}][sample.local_bsz]
          .push_back(sample);
    }
  }
  auto average = [](const std::map<double, std::vector<Sample>>& by_bsz) {
    std::vector<Sample> out;
    for (const auto& [bsz, samples] : by_bsz) {
      Sample mean{bsz, 0, 0};
      for (const Sample& s : samples) {
        mean.step_seconds += s.step_seconds / samples.size();
        mean.sync_seconds += s.sync_seconds / samples.size();
      }
      out.push_back(mean);
    }
    return out;
  };
  for (const auto& [placement, by_bsz] : by_placement) app->placements_[placement] = average(by_bsz);
  for (const auto& [key, by_bsz] : grid_points) {
    if (app->grid_.empty() || app->grid_.back().nodes != key.first) {
      app->grid_.push_back(NodeLevel{key.first, {}});
    }
    app->grid_.back().levels.push_back(
        ReplicaLevel{key.second, static_cast<double>(key.second) / key.first, average(by_bsz)});
  }

  // Limits: Pollux's constants, else from the traces.
  app->init_batch_size_ = limits.init_batch_size > 0 ? limits.init_batch_size
                                                     : app->validation_.begin()->first;
  app->max_batch_size_ = limits.max_batch_size > 0 ? limits.max_batch_size
                                                   : app->validation_.rbegin()->first;
  double min_local = std::numeric_limits<double>::infinity(), max_local = 0;
  for (const auto& [placement, samples] : app->placements_) {
    min_local = std::min(min_local, samples.front().local_bsz);
    max_local = std::max(max_local, samples.back().local_bsz);
  }
  app->min_local_bsz_ =
      limits.min_local_bsz > 0 ? limits.min_local_bsz : static_cast<int>(min_local);
  app->max_local_bsz_ =
      limits.max_local_bsz > 0 ? limits.max_local_bsz : static_cast<int>(max_local);
  size_t shortest = std::numeric_limits<size_t>::max();
  for (const auto& [bsz, rows] : app->validation_) shortest = std::min(shortest, rows.size());
  app->max_epochs_ = limits.max_epochs > 0 ? limits.max_epochs : static_cast<int>(shortest);
  if (static_cast<size_t>(app->max_epochs_) > shortest) {
    return absl::InvalidArgumentError(absl::StrCat(
        directory, ": max_epochs ", app->max_epochs_, " but a validation table has only ",
        shortest, " epochs"));
  }
  if (app->max_batch_size_ < app->min_local_bsz_ || app->init_batch_size_ > app->max_batch_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(directory, ": inconsistent batch sizes (init ", app->init_batch_size_,
                     ", max ", app->max_batch_size_, ", min local ", app->min_local_bsz_, ")"));
  }
  return std::shared_ptr<const Application>(std::move(app));
}

std::vector<int> Application::validated_batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& [bsz, rows] : validation_) sizes.push_back(bsz);
  return sizes;
}

bool Application::IsMeasured(const std::vector<int>& placement) const {
  return placements_.count(NormalisePlacement(placement)) > 0;
}

StepTimes Application::Interpolate(const std::vector<Sample>& samples, double local_bsz) {
  if (local_bsz <= samples.front().local_bsz) {
    return {samples.front().step_seconds, samples.front().sync_seconds};
  }
  if (local_bsz >= samples.back().local_bsz) {
    return {samples.back().step_seconds, samples.back().sync_seconds};
  }
  auto upper = std::lower_bound(samples.begin(), samples.end(), local_bsz,
                                [](const Sample& s, double b) { return s.local_bsz < b; });
  auto lower = upper - 1;
  const double w = Weight(local_bsz, lower->local_bsz, upper->local_bsz);
  return Mix({lower->step_seconds, lower->sync_seconds}, {upper->step_seconds, upper->sync_seconds},
             w);
}

StepTimes Application::InterpolateNodeLevel(const NodeLevel& level, double replicas_per_node,
                                            double local_bsz) const {
  const std::vector<ReplicaLevel>& levels = level.levels;
  if (replicas_per_node <= levels.front().replicas_per_node) {
    return Interpolate(levels.front().samples, local_bsz);
  }
  if (replicas_per_node >= levels.back().replicas_per_node) {
    return Interpolate(levels.back().samples, local_bsz);
  }
  size_t upper = 1;
  while (levels[upper].replicas_per_node < replicas_per_node) ++upper;
  const ReplicaLevel& lo = levels[upper - 1];
  const ReplicaLevel& hi = levels[upper];
  return Mix(Interpolate(lo.samples, local_bsz), Interpolate(hi.samples, local_bsz),
             Weight(replicas_per_node, lo.replicas_per_node, hi.replicas_per_node));
}

StepTimes Application::ComputeThroughput(const std::vector<int>& normalised,
                                         double local_bsz) const {
  auto found = placements_.find(normalised);
  if (found != placements_.end()) return Interpolate(found->second, local_bsz);
  int replicas = 0;
  for (int gpus : normalised) replicas += gpus;
  // Pollux caps the node count at the largest measured (16).
  const int nodes = std::min<int>(normalised.size(), grid_.back().nodes);
  const double per_node = static_cast<double>(replicas) / nodes;
  if (nodes <= grid_.front().nodes) return InterpolateNodeLevel(grid_.front(), per_node, local_bsz);
  size_t upper = 1;
  while (grid_[upper].nodes < nodes) ++upper;
  const NodeLevel& lo = grid_[upper - 1];
  const NodeLevel& hi = grid_[upper];
  return Mix(InterpolateNodeLevel(lo, per_node, local_bsz),
             InterpolateNodeLevel(hi, per_node, local_bsz), Weight(nodes, lo.nodes, hi.nodes));
}

StepTimes Application::Throughput(const std::vector<int>& placement, double local_bsz) const {
  std::pair<std::vector<int>, double> key(NormalisePlacement(placement), local_bsz);
  if (key.first.empty()) return {};
  {
    absl::MutexLock lock(&mutex_);
    auto found = memo_.find(key);
    if (found != memo_.end()) return found->second;
  }
  const StepTimes times = ComputeThroughput(key.first, local_bsz);
  absl::MutexLock lock(&mutex_);
  memo_.emplace(std::move(key), times);
  return times;
}

void Application::Bracket(double batch_size, int* lower, int* upper, double* weight) const {
  batch_size = std::clamp(batch_size, static_cast<double>(validation_.begin()->first),
                          static_cast<double>(validation_.rbegin()->first));
  auto hi = validation_.lower_bound(static_cast<int>(std::ceil(batch_size)));
  if (hi == validation_.end()) --hi;
  auto lo = hi;
  if (lo->first > batch_size && lo != validation_.begin()) --lo;
  *lower = lo->first;
  *upper = hi->first;
  *weight = Weight(batch_size, lo->first, hi->first);
}

GradientStats Application::GradStats(double batch_size, int epoch) const {
  int lo, hi;
  double w;
  Bracket(batch_size, &lo, &hi, &w);
  const ValidationRow& a = validation_.at(lo).at(epoch);
  const ValidationRow& b = validation_.at(hi).at(epoch);
  return {a.grad_sqr + (b.grad_sqr - a.grad_sqr) * w, a.grad_var + (b.grad_var - a.grad_var) * w};
}

double Application::Progress(int epoch) const {
  if (epoch <= 0) return 0.0;
  double least = std::numeric_limits<double>::infinity();
  for (const auto& [bsz, rows] : validation_) least = std::min(least, rows.at(epoch - 1).progress);
  return least;
}

int Application::CompletionEpoch(double /*batch_size*/) const { return max_epochs_ - 1; }

double Application::Iteration(double batch_size, int epoch) const {
  int lo, hi;
  double w;
  Bracket(batch_size, &lo, &hi, &w);
  const double a = validation_.at(lo).at(epoch).iteration;
  const double b = validation_.at(hi).at(epoch).iteration;
  return a + (b - a) * w;
}

absl::StatusOr<ApplicationCatalog> LoadPolluxApplications(const std::string& apps_directory) {
  ApplicationCatalog catalog;
  for (const char* name : {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}) {
    const std::string directory = (std::filesystem::path(apps_directory) / name).string();
    TANDEM_ASSIGN_OR_RETURN(catalog[name], Application::Load(directory, PolluxLimits(name)));
  }
  return catalog;
}

}  // namespace tandem::cluster
