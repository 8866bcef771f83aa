// A training application measured by Pollux (OSDI'21 artifact): how fast it runs on a placement
// of GPUs and how well it trains at a batch size. The simulator uses it as the ground truth a
// job experiences; policies see it only through the functions in JobView.
//
// An application directory holds Pollux's traces (see tests/data/cluster/README.md):
//   placements.csv   step and sync time for every placement of up to 4 nodes x 4 GPUs
//   scalability.csv  step and sync time at 6, 8, 12 and 16 nodes
//   validation-B.csv per-epoch progress, iterations, metric and gradient statistics at batch B
//
// Throughput of a measured placement is interpolated linearly in the local batch size, as
// Pollux does. Pollux interpolates every other placement with scipy's LinearNDInterpolator
// (Delaunay triangulation of (nodes, replicas, local batch) points); this module instead
// interpolates on the measured grid in (nodes, replicas per node, local batch): linear in local
// batch size at each measured (nodes, replicas), linear in replicas per node between the two
// measured neighbours at each node count, then linear between the two measured node counts
// around the query. docs/cluster.md discusses the difference.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::cluster {

struct StepTimes {
  double step_seconds = 0;  // one optimiser step (compute + synchronisation)
  double sync_seconds = 0;  // the part of it spent synchronising gradients
};

struct GradientStats {
  double sqr = 0;  // squared norm of the true gradient (estimate)
  double var = 0;  // gradient variance (estimate)
};

// Pollux's per-application constants. 0 takes the value from the traces: the initial batch
// size is the smallest validated batch size, the maximum the largest; local batch sizes span
// those measured in placements.csv; max_epochs is the shortest validation table.
struct ApplicationLimits {
  int init_batch_size = 0;
  int max_batch_size = 0;
  int min_local_bsz = 0;
  int max_local_bsz = 0;
  int max_epochs = 0;
};

// The constants the Pollux artifact uses for its six applications (bert 2 epochs, cifar10 100,
// ncf 10, imagenet 90, deepspeech2 80, yolov3 50 with a maximum local batch of 8).
ApplicationLimits PolluxLimits(const std::string& name);

class Application {
 public:
  // Loads the traces in `directory`; the application is named after the directory.
  // InvalidArgument (naming the file) for malformed or missing traces.
  static absl::StatusOr<std::shared_ptr<const Application>> Load(
      const std::string& directory, const ApplicationLimits& limits = {});

  const std::string& name() const { return name_; }
  int init_batch_size() const { return init_batch_size_; }
  int max_batch_size() const { return max_batch_size_; }
  int min_local_bsz() const { return min_local_bsz_; }
  int max_local_bsz() const { return max_local_bsz_; }
  int max_epochs() const { return max_epochs_; }
  // Validated batch sizes, ascending.
  std::vector<int> validated_batch_sizes() const;

  // Step and sync time with `placement` (GPUs per node; zeros ignored) at a local batch size.
  // Local batch sizes outside the measured range are clamped to it (Pollux raises instead).
  // Thread-safe; results are memoised.
  StepTimes Throughput(const std::vector<int>& placement, double local_bsz) const;
  // True when the placement (up to rotation) was measured in placements.csv.
  bool IsMeasured(const std::vector<int>& placement) const;

  // Gradient statistics during `epoch` at `batch_size`, interpolated linearly between the two
  // validated batch sizes around it (clamped to the validated range).
  GradientStats GradStats(double batch_size, int epoch) const;
  // Statistical progress needed to complete `epoch` epochs (0 for epoch 0): the least over the
  // validated batch sizes, as Pollux.
  double Progress(int epoch) const;
  // The last epoch to run: training completes once this epoch is done (max_epochs - 1; no
  // application has a target metric in the artifact).
  int CompletionEpoch(double batch_size) const;
  // Iterations done after completing `epoch` at `batch_size` (interpolated like GradStats).
  double Iteration(double batch_size, int epoch) const;

 private:
  struct Sample {
    double local_bsz = 0;
    double step_seconds = 0;
    double sync_seconds = 0;
  };
  struct ValidationRow {
    double progress = 0;
    double iteration = 0;
    double metric = 0;
    double grad_sqr = 0;
    double grad_var = 0;
  };
  struct ReplicaLevel {  // one (nodes, replicas) point of the interpolation grid
    int replicas = 0;
    double replicas_per_node = 0;
    std::vector<Sample> samples;  // ascending local batch size
  };
  struct NodeLevel {
    int nodes = 0;
    std::vector<ReplicaLevel> levels;  // ascending replicas
  };

  Application() = default;
  static StepTimes Interpolate(const std::vector<Sample>& samples, double local_bsz);
  StepTimes InterpolateNodeLevel(const NodeLevel& level, double replicas_per_node,
                                 double local_bsz) const;
  StepTimes ComputeThroughput(const std::vector<int>& normalised, double local_bsz) const;
  // Lower and upper validated batch sizes around `batch_size` and the weight of the upper.
  void Bracket(double batch_size, int* lower, int* upper, double* weight) const;

  std::string name_;
  int init_batch_size_ = 0;
  int max_batch_size_ = 0;
  int min_local_bsz_ = 0;
  int max_local_bsz_ = 0;
  int max_epochs_ = 0;
  std::map<int, std::vector<ValidationRow>> validation_;
  std::map<std::vector<int>, std::vector<Sample>> placements_;  // key: normalised placement
  std::vector<NodeLevel> grid_;                                 // ascending nodes
  mutable absl::Mutex mutex_;
  mutable absl::flat_hash_map<std::pair<std::vector<int>, double>, StepTimes> memo_
      ABSL_GUARDED_BY(mutex_);
};

// Applications by name.
using ApplicationCatalog = std::map<std::string, std::shared_ptr<const Application>>;

// Loads bert, cifar10, deepspeech2, imagenet, ncf and yolov3 from `apps_directory`/<name> with
// PolluxLimits.
absl::StatusOr<ApplicationCatalog> LoadPolluxApplications(const std::string& apps_directory);

// The placement Pollux looks up: zeros dropped, then the lexicographically smallest rotation.
std::vector<int> NormalisePlacement(const std::vector<int>& placement);

}  // namespace tandem::cluster
