// Pollux's goodput model (Qiao et al., OSDI'21): goodput = throughput x statistical efficiency.
//
// Throughput comes from a fitted performance model of one step of data-parallel SGD:
//   T_accum   = alpha_c + beta_c * atomic_bsz                         (one micro-step)
//   T_network = alpha_n + beta_n * max(replicas - 2, 0)  across nodes
//             = alpha_r + beta_r * max(replicas - 2, 0)  within one node (replicas > 1)
//   T_optim   = (T_accum^gamma + T_network^gamma)^(1/gamma)           (overlap, gamma in [1,10])
//   T_step    = accum_steps * T_accum + T_optim
// Statistical efficiency at batch size M relative to the initial batch size M0 uses the
// gradient noise: with s = M / M0, efficiency = (var + sqr) / (var / s + sqr) / s, which is 1
// at M0 and decreases with M.
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tandem::cluster {

struct PerfParams {
  double alpha_c = 0;  // constant term of the compute time (seconds)
  double beta_c = 0;   // compute seconds per sample of the atomic batch
  double alpha_n = 0;  // constant term of inter-node synchronisation
  double beta_n = 0;   // inter-node retrogression per replica beyond 2
  double alpha_r = 0;  // constant term of intra-node synchronisation
  double beta_r = 0;   // intra-node retrogression per replica beyond 2
  double gamma = 1;    // compute/network overlap (1: none, 10: about full)
};

struct GradParams {
  double sqr = 0;
  double var = 0;
};

// One measured configuration: the time of an accumulation micro-step (compute only) and of an
// optimiser step (compute and synchronisation).
struct ThroughputSample {
  int num_nodes = 1;
  int num_replicas = 1;
  double atomic_bsz = 1;
  double accum_step_seconds = 0;
  double optim_step_seconds = 0;
};

double PredictAccumSeconds(const PerfParams& params, double atomic_bsz);
double PredictNetworkSeconds(const PerfParams& params, int num_nodes, int num_replicas);
double PredictOptimSeconds(const PerfParams& params, double accum_seconds,
                           double network_seconds);

// The fit's objective, as Pollux: RMS log error of the accumulation and optimiser step times,
// plus 1e-3 (gamma - 1)^2 and 1e-2 ((beta_n / alpha_n)^2 + (beta_r / alpha_r)^2).
double PerfFitLoss(const PerfParams& params, const std::vector<ThroughputSample>& samples);

// Fits PerfParams to the samples as Pollux's fit_perf_params does: same start point, bounds
// (alpha/beta >= 1e-8, gamma in [1, 10]), same parameters pinned when the samples cannot
// identify them (one atomic batch size: alpha_c = mean accum time / 2; no multi-node samples:
// network across nodes pinned, then raised to 1.1x the intra-node terms; no single-node
// multi-replica samples: intra-node pinned; no more than 2 replicas: retrogression pinned).
// Pollux minimises with scipy's L-BFGS-B; this uses Nelder-Mead in log space (alpha, beta)
// with restarts, no dependency. `samples` must not be empty. With `warm_start` (the fit of the
// same job's samples before its latest one) the search starts there when that is no worse than
// the cold start, with a smaller simplex and fewer restarts: a refit costs a fraction of a cold
// one, and lands on an optimum of the same loss (a local one, as the cold fit's may be).
PerfParams FitPerfParams(const std::vector<ThroughputSample>& samples,
                         const PerfParams* warm_start = nullptr);

struct BatchConfig {
  double goodput = 0;   // samples/s times efficiency
  int atomic_bsz = 0;   // per-replica micro-batch
  int accum_steps = 0;  // extra accumulation micro-steps per optimiser step
};

class GoodputFunction {
 public:
  GoodputFunction(const PerfParams& perf, const GradParams& grad, int init_batch_size)
      : perf_(perf), grad_(grad), init_batch_size_(init_batch_size) {}

  double Throughput(int num_nodes, int num_replicas, int atomic_bsz, int accum_steps) const;
  double Efficiency(double batch_size) const;
  double Evaluate(int num_nodes, int num_replicas, int atomic_bsz, int accum_steps) const;

  // The best (atomic batch, accumulation steps) for nodes x replicas: 50 total batch sizes in
  // geometric steps from max(init, min_atomic * replicas) to max_batch_size, each split into
  // micro-batches of at most max_atomic (with accumulation; one replica above the initial
  // batch always accumulates at least once); configurations with an atomic batch outside
  // [min_atomic, max_atomic] are worth 0.
  BatchConfig Optimize(int num_nodes, int num_replicas, int max_batch_size, int min_atomic_bsz,
                       int max_atomic_bsz, bool accumulation) const;

  const PerfParams& perf() const { return perf_; }
  const GradParams& grad() const { return grad_; }
  int init_batch_size() const { return init_batch_size_; }

 private:
  PerfParams perf_;
  GradParams grad_;
  int init_batch_size_;
};

// Goodput at (nodes, replicas), each with its best batch configuration, relative to one GPU.
// Thread-safe; memoised.
class SpeedupFunction {
 public:
  SpeedupFunction(GoodputFunction goodput, int max_batch_size, int min_atomic_bsz,
                  int max_atomic_bsz, bool accumulation);
  double operator()(int num_nodes, int num_replicas) const;
  const GoodputFunction& goodput() const { return goodput_; }

 private:
  GoodputFunction goodput_;
  int max_batch_size_;
  int min_atomic_bsz_;
  int max_atomic_bsz_;
  bool accumulation_;
  double base_goodput_;
  mutable absl::Mutex mutex_;
  mutable absl::flat_hash_map<std::pair<int, int>, double> memo_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::cluster
