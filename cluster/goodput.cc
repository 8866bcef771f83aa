#include "cluster/goodput.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace tandem::cluster {
namespace {

constexpr int kParams = 7;
constexpr double kLowerBound = 1e-8;
constexpr double kMinGamma = 1.0;
constexpr double kMaxGamma = 10.0;
// A warm fit's initial simplex (log space) and most restarts.
constexpr double kWarmStep = 0.3;
constexpr int kWarmRestarts = 2;
// A warm fit stops when the simplex's values are within kWarmTolerance of each other and its
// vertices within kWarmSize in every coordinate (a cold fit: 1e-12 and 1e-7); a speedup moves
// by about kWarmSize relative.
constexpr double kWarmTolerance = 1e-10;
constexpr double kWarmSize = 1e-5;
using Vector = std::vector<double>;

PerfParams FromArray(const std::array<double, kParams>& p) {
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
}

// Nelder-Mead minimisation of f from x0 with initial steps `step` (one per coordinate).
Vector NelderMead(const std::function<double(const Vector&)>& f, const Vector& x0,
                  const Vector& step, int max_evaluations, double tolerance,
                  double size_tolerance) {
  const size_t n = x0.size();
  std::vector<Vector> simplex(n + 1, x0);
  std::vector<double> values(n + 1);
  for (size_t i = 0; i < n; ++i) simplex[i + 1][i] += step[i];
  for (size_t i = 0; i <= n; ++i) values[i] = f(simplex[i]);
  int evaluations = static_cast<int>(n + 1);
  std::vector<size_t> order(n + 1);
  while (evaluations < max_evaluations) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
    const size_t best = order.front(), worst = order.back(), second = order[n - 1];
    double size = 0;
    for (size_t i = 0; i <= n; ++i) {
      for (size_t d = 0; d < n; ++d) {
        size = std::max(size, std::fabs(simplex[i][d] - simplex[best][d]));
      }
    }
    if (values[worst] - values[best] <= tolerance && size <= size_tolerance) break;
    Vector centroid(n, 0.0);
    for (size_t i = 0; i <= n; ++i) {
      if (i == worst) continue;
      for (size_t d = 0; d < n; ++d) centroid[d] += simplex[i][d] / n;
    }
    auto along = [&](double t) {
      Vector x(n);
      for (size_t d = 0; d < n; ++d) x[d] = centroid[d] + t * (simplex[worst][d] - centroid[d]);
      return x;
    };
    Vector reflected = along(-1.0);
    const double fr = f(reflected);
    ++evaluations;
    if (fr < values[best]) {
      Vector expanded = along(-2.0);
      const double fe = f(expanded);
      ++evaluations;
      if (fe < fr) {
        simplex[worst] = std::move(expanded);
        values[worst] = fe;
      } else {
        simplex[worst] = std::move(reflected);
        values[worst] = fr;
      }
      continue;
    }
    if (fr < values[second]) {
      simplex[worst] = std::move(reflected);
      values[worst] = fr;
      continue;
    }
    const bool outside = fr < values[worst];
    Vector contracted = along(outside ? -0.5 : 0.5);
    const double fc = f(contracted);
    ++evaluations;
    if (fc < (outside ? fr : values[worst])) {
      simplex[worst] = std::move(contracted);
      values[worst] = fc;
      continue;
    }
    for (size_t i = 0; i <= n; ++i) {  // shrink towards the best
      if (i == best) continue;
      for (size_t d = 0; d < n; ++d) {
        simplex[i][d] = simplex[best][d] + 0.5 * (simplex[i][d] - simplex[best][d]);
      }
      values[i] = f(simplex[i]);
      ++evaluations;
    }
  }
  size_t best = 0;
  for (size_t i = 1; i <= n; ++i) {
    if (values[i] < values[best]) best = i;
  }
  return simplex[best];
}

}  // namespace

double PredictAccumSeconds(const PerfParams& params, double atomic_bsz) {
  return params.alpha_c + params.beta_c * atomic_bsz;
}

double PredictNetworkSeconds(const PerfParams& params, int num_nodes, int num_replicas) {
  // The slowest link between replicas decides: across nodes, else within one node; a single
  // replica synchronises nothing (Pollux's 1e-8 placeholders keep the logarithms finite).
  double bottleneck = kLowerBound, retrogress = kLowerBound;
  if (num_nodes > 1) {
    bottleneck = params.alpha_n;
    retrogress = params.beta_n;
  } else if (num_replicas > 1) {
    bottleneck = params.alpha_r;
    retrogress = params.beta_r;
  }
  return bottleneck + retrogress * std::max(num_replicas - 2.0, kLowerBound);
}

double PredictOptimSeconds(const PerfParams& params, double accum_seconds,
                           double network_seconds) {
  const double g = params.gamma;
  return std::pow(std::pow(accum_seconds, g) + std::pow(network_seconds, g), 1.0 / g);
}

namespace {

// A sample as the fit's objective reads it: the logarithms of the measured times computed once.
struct LogSample {
  int num_nodes = 1;
  int num_replicas = 1;
  double atomic_bsz = 1;
  double log_accum_seconds = 0;
  double log_optim_seconds = 0;
};

std::vector<LogSample> ToLogSamples(const std::vector<ThroughputSample>& samples) {
  std::vector<LogSample> logs;
  logs.reserve(samples.size());
  for (const ThroughputSample& s : samples) {
    logs.push_back({s.num_nodes, s.num_replicas, s.atomic_bsz, std::log(s.accum_step_seconds),
                    std::log(s.optim_step_seconds)});
  }
  return logs;
}

double LogSampleLoss(const PerfParams& params, const std::vector<LogSample>& samples) {
  double accum_error = 0, optim_error = 0;
  const double g = params.gamma;
  for (const LogSample& s : samples) {
    const double accum = PredictAccumSeconds(params, s.atomic_bsz);
    const double network = PredictNetworkSeconds(params, s.num_nodes, s.num_replicas);
    const double log_optim = g == 1.0 ? std::log(accum + network)
                                      : std::log(std::pow(accum, g) + std::pow(network, g)) / g;
    const double da = std::log(accum) - s.log_accum_seconds;
    const double d_o = log_optim - s.log_optim_seconds;
    accum_error += da * da;
    optim_error += d_o * d_o;
  }
  const double count = static_cast<double>(samples.size());
  const double regularise_gamma = 1e-3 * (params.gamma - 1) * (params.gamma - 1);
  const double regularise_retrogression =
      1e-2 * ((params.beta_n / params.alpha_n) * (params.beta_n / params.alpha_n) +
              (params.beta_r / params.alpha_r) * (params.beta_r / params.alpha_r));
  return std::sqrt(accum_error / count) + std::sqrt(optim_error / count) + regularise_gamma +
         regularise_retrogression;
}

}  // namespace

double PerfFitLoss(const PerfParams& params, const std::vector<ThroughputSample>& samples) {
  return LogSampleLoss(params, ToLogSamples(samples));
}

PerfParams FitPerfParams(const std::vector<ThroughputSample>& samples,
                         const PerfParams* warm_start) {
  std::array<double, kParams> start = {1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3};
  std::array<bool, kParams> pinned{};
  bool one_batch_size = true, multi_node = false, single_node_multi_replica = false,
       more_than_two = false;
  double mean_accum = 0;
  for (const ThroughputSample& s : samples) {
    one_batch_size = one_batch_size && s.atomic_bsz == samples.front().atomic_bsz;
    multi_node = multi_node || s.num_nodes > 1;
    single_node_multi_replica = single_node_multi_replica || (s.num_nodes == 1 && s.num_replicas > 1);
    more_than_two = more_than_two || s.num_replicas > 2;
    mean_accum += s.accum_step_seconds / samples.size();
  }
  auto pin = [&](int i, double value) {
    start[i] = value;
    pinned[i] = true;
  };
  if (one_batch_size) pin(0, mean_accum / 2);
  if (!multi_node) {
    pin(2, kLowerBound);
    pin(3, kLowerBound);
  }
  if (!single_node_multi_replica) {
    pin(4, kLowerBound);
    pin(5, kLowerBound);
  }
  if (!more_than_two) {
    pin(3, kLowerBound);
    pin(5, kLowerBound);
  }
  // Search coordinates: log of each free alpha/beta, gamma itself (clamped into its bounds).
  std::vector<int> free;
  for (int i = 0; i < kParams; ++i) {
    if (!pinned[i]) free.push_back(i);
  }
  auto decode = [&](const Vector& x) {
    std::array<double, kParams> p = start;
    for (size_t k = 0; k < free.size(); ++k) {
      const int i = free[k];
      p[i] = i == 6 ? std::clamp(x[k], kMinGamma, kMaxGamma)
                    : std::max(std::exp(x[k]), kLowerBound);
    }
    return p;
  };
  const std::vector<LogSample> logs = ToLogSamples(samples);
  auto objective = [&](const Vector& x) {
    const double loss = LogSampleLoss(FromArray(decode(x)), logs);
    return std::isfinite(loss) ? loss : std::numeric_limits<double>::max();
  };
  Vector x(free.size());
  for (size_t k = 0; k < free.size(); ++k) {
    const int i = free[k];
    x[k] = i == 6 ? start[i] : std::log(start[i]);
  }
  // From a previous fit: its free values where they are off the lower bound (a parameter that
  // was pinned there starts where a cold fit would), when that starts lower than the cold start.
  // The optimum moves little when one sample is added, so a smaller simplex and fewer restarts
  // find it.
  bool warm = false;
  if (warm_start != nullptr && !free.empty()) {
    const std::array<double, kParams> previous = {
        warm_start->alpha_c, warm_start->beta_c,  warm_start->alpha_n, warm_start->beta_n,
        warm_start->alpha_r, warm_start->beta_r, warm_start->gamma};
    Vector from = x;
    for (size_t k = 0; k < free.size(); ++k) {
      const int i = free[k];
      if (i == 6) {
        from[k] = std::clamp(previous[i], kMinGamma, kMaxGamma);
      } else if (previous[i] > 2 * kLowerBound && std::isfinite(previous[i])) {
        from[k] = std::log(previous[i]);
      }
    }
    if (objective(from) <= objective(x)) {
      x = std::move(from);
      warm = true;
    }
  }
  Vector step(free.size(), warm ? kWarmStep : 1.0);
  std::array<double, kParams> result = start;
  if (!free.empty()) {
    double best = objective(x);
    const int restarts = warm ? kWarmRestarts : 6;
    for (int restart = 0; restart < restarts; ++restart) {
      Vector next = warm ? NelderMead(objective, x, step, 3000, kWarmTolerance, kWarmSize)
                         : NelderMead(objective, x, step, 3000, 1e-12, 1e-7);
      const double value = objective(next);
      const bool improved = value < best - 1e-10;
      if (value < best) {
        best = value;
        x = std::move(next);
      }
      if (!improved && restart > 0) break;
      for (double& s : step) s = 0.3;
    }
    result = decode(x);
  }
  if (!multi_node) {
    // Prior: crossing nodes is no faster than staying on one.
    result[2] = std::max(result[2], result[4] * 1.1);
    result[3] = std::max(result[3], result[5] * 1.1);
  }
  return FromArray(result);
}

double GoodputFunction::Throughput(int num_nodes, int num_replicas, int atomic_bsz,
                                   int accum_steps) const {
  const double accum = PredictAccumSeconds(perf_, atomic_bsz);
  const double network = PredictNetworkSeconds(perf_, num_nodes, num_replicas);
  const double optim = PredictOptimSeconds(perf_, accum, network);
  const double total = accum_steps * accum + optim;
  const double batch_size = static_cast<double>(num_replicas) * atomic_bsz * (accum_steps + 1);
  return batch_size / total;
}

double GoodputFunction::Efficiency(double batch_size) const {
  const double scale = batch_size / init_batch_size_;
  const double denominator = grad_.var / scale + grad_.sqr;
  const double gain = denominator > 0 ? (grad_.var + grad_.sqr) / denominator : 1.0;
  return gain / scale;
}

double GoodputFunction::Evaluate(int num_nodes, int num_replicas, int atomic_bsz,
                                 int accum_steps) const {
  const double batch_size = static_cast<double>(num_replicas) * atomic_bsz * (accum_steps + 1);
  return Throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * Efficiency(batch_size);
}

BatchConfig GoodputFunction::Optimize(int num_nodes, int num_replicas, int max_batch_size,
                                      int min_atomic_bsz, int max_atomic_bsz,
                                      bool accumulation) const {
  constexpr int kCandidates = 50;
  constexpr double kEps = 1e-8;
  if (max_batch_size <= 0) max_batch_size = init_batch_size_;
  if (min_atomic_bsz <= 0) min_atomic_bsz = 1;
  if (max_atomic_bsz <= 0) max_atomic_bsz = max_batch_size;
  const double low = std::max<double>(init_batch_size_,
                                      static_cast<double>(min_atomic_bsz) * num_replicas);
  const double high = max_batch_size;
  BatchConfig best;
  bool found = false;
  for (int i = 0; i < kCandidates; ++i) {
    double batch_size = i == 0 ? low
                        : i == kCandidates - 1
                            ? high
                            : std::exp(std::log(low) +
                                       (std::log(high) - std::log(low)) * i / (kCandidates - 1));
    const double local = batch_size / num_replicas;
    int accum_steps = 0;
    if (accumulation) {
      accum_steps = static_cast<int>(std::ceil(local / max_atomic_bsz - kEps)) - 1;
      if (num_replicas == 1 && local > init_batch_size_ + kEps) {
        accum_steps = std::max(accum_steps, 1);
      }
    }
    const int atomic = static_cast<int>(std::ceil(local / (accum_steps + 1) - kEps));
    double goodput = 0.0;
    if (min_atomic_bsz <= atomic && atomic <= max_atomic_bsz) {
      goodput = Evaluate(num_nodes, num_replicas, atomic, accum_steps);
    }
    if (!found || goodput > best.goodput) {
      best = {goodput, atomic, accum_steps};
      found = true;
    }
  }
  return best;
}

SpeedupFunction::SpeedupFunction(GoodputFunction goodput, int max_batch_size,
                                 int min_atomic_bsz, int max_atomic_bsz, bool accumulation)
    : goodput_(std::move(goodput)),
      max_batch_size_(max_batch_size),
      min_atomic_bsz_(min_atomic_bsz),
      max_atomic_bsz_(max_atomic_bsz),
      accumulation_(accumulation) {
  base_goodput_ = goodput_
                      .Optimize(1, 1, max_batch_size_, min_atomic_bsz_, max_atomic_bsz_,
                                accumulation_)
                      .goodput;
}

double SpeedupFunction::operator()(int num_nodes, int num_replicas) const {
  if (num_nodes <= 0 || num_replicas <= 0) return 0.0;
  const std::pair<int, int> key(num_nodes, num_replicas);
  {
    absl::MutexLock lock(&mutex_);
    auto found = memo_.find(key);
    if (found != memo_.end()) return found->second;
  }
  const double goodput = goodput_
                             .Optimize(num_nodes, num_replicas, max_batch_size_,
                                       min_atomic_bsz_, max_atomic_bsz_, accumulation_)
                             .goodput;
  const double speedup = base_goodput_ > 0 ? goodput / base_goodput_ : 0.0;
  absl::MutexLock lock(&mutex_);
  memo_[key] = speedup;
  return speedup;
}

}  // namespace tandem::cluster
