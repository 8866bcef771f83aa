// Gavel's heterogeneity-aware max-min fairness policy (Narayanan et al., OSDI 2020), as a linear
// program solved with GLPK, and Gavel's round-based mechanism that turns its time shares into
// one round's placement.
//
// Jobs run on one of several device types (e.g. V100, P100, K80); each job is faster on some
// types than others. The policy chooses a time share X[j][k], the fraction of wall-clock time
// job j should spend on type k, that maximises the smallest normalised throughput:
//
//   maximise t
//   subject to  sum_k throughput[j][k] * X[j][k] / (priority_weight[j] * equal_share[j]) >= t
//               sum_k X[j][k] <= 1                          (a job runs in one place at a time)
//               sum_j scale_factor[j] * X[j][k] <= devices_per_type[k]          (capacity)
//               X >= 0;  X[j][k] = 0 where job j cannot run on type k
//
// Normalisation (equal_share[j]): the job's throughput when it is given 1/n of every type's
// devices (n = number of jobs), run as placements of scale_factor[j] devices; when that share
// would add up to more than all of the job's time, it is scaled down to full time keeping the
// proportions between types (the split of Gavel's ProportionalPolicy, which its water-filling
// policy normalises by):
//
//   E[j][k]        = min(devices[k] / total_devices, devices[k] / (n * scale_factor[j]))
//   equal_share[j] = sum_k throughput[j][k] * E[j][k]
//
// When E is not capped this equals Gavel's normalisation (scale_factor * throughput(X) /
// throughput(proportional X)) up to one constant for all jobs, so the optimum is the same. E is
// itself feasible, so with unit weights the optimum t is >= 1: every job does at least as well
// as in its own 1/n of the cluster (sharing incentive).
//
// A job cannot run on type k when throughput[j][k] == 0 or scale_factor[j] > devices[k]; such
// entries count as zero throughput everywhere, including in equal_share.
//
// Water-filling (on by default; Gavel's MaxMinFairnessWaterFilling policy): the basic LP only
// lifts the worst-off jobs, and may leave capacity idle that other jobs could use. Water-filling
// repeats: solve for t; fix at t the jobs that cannot exceed t without some job dropping below
// it; maximise the smallest of the rest. The result is the lexicographic max-min allocation.
// Gavel finds the bottlenecked jobs with a mixed-integer program; here a job whose fairness row
// has a positive dual value is bottlenecked (strict complementarity: its row binds in every
// optimum), and as the duals sum to 1 every solve fixes at least one job. Cost: at most `jobs`
// LPs, each warm-started from the previous basis (512 jobs on 3 types: about 0.1 s).
#pragma once

#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cluster {

// A cluster and the jobs sharing it. Row j of `throughput` describes job j; column k, device
// type k.
struct GavelProblem {
  // throughput[j][k]: job j's throughput on device type k (work units/s) using scale_factor[j]
  // devices of that type; 0 = cannot run there. Finite, >= 0.
  std::vector<std::vector<double>> throughput;
  // Devices a job uses at once (>= 1), one per job.
  std::vector<int> scale_factor;
  // > 0; a job with weight 2 is entitled to twice the normalised throughput. Empty = all 1.
  std::vector<double> priority_weight;
  // Cluster capacity per device type (>= 0).
  std::vector<int> devices_per_type;
  // Row j stands for job_count[j] identical jobs (>= 1; empty = all 1). Identical jobs get the
  // same time shares in the lexicographic max-min allocation (it is unique in normalised
  // throughputs, and averaging the time shares of symmetric jobs keeps an allocation
  // feasible), so one row per class of identical jobs gives each of them the time shares they
  // would get one row each, with an LP the size of the number of classes. n in equal_share
  // counts jobs, not rows; the capacity rows count job_count[j] x scale_factor[j] devices.
  // AssignRound takes one row per job (job_count empty).
  std::vector<int> job_count;
};

struct GavelOptions {
  bool water_filling = true;
};

struct GavelSolution {
  // time_share[j][k] = X[j][k] in [0, 1]: fraction of time job j runs on type k.
  std::vector<std::vector<double>> time_share;
  // Throughput of job j under its equal share (the normalisation above), work units/s.
  std::vector<double> equal_share_throughput;
  // sum_k throughput[j][k] * X[j][k] / equal_share_throughput[j]: 1 = as fast as in its own
  // equal share. Not divided by the priority weight.
  std::vector<double> normalized_throughput;
  // The max-min level t of the first LP: min_j normalized_throughput[j] / priority_weight[j].
  // Water-filling never lowers it.
  double objective = 0;
};

// Solves the policy. No jobs: an empty solution with objective 0. Bad input (ragged or
// mismatched sizes, negative or non-finite values, a job that can run nowhere): InvalidArgument
// naming the job or device type. A GLPK failure: Internal with GLPK's return or status code.
absl::StatusOr<GavelSolution> SolveMaxMinFairness(const GavelProblem& problem,
                                                  const GavelOptions& options = {});

// Checks `problem` as SolveMaxMinFairness does.
absl::Status ValidateGavelProblem(const GavelProblem& problem);

// One round of Gavel's round-based mechanism. rounds_received[j][k] is how many rounds (may be
// fractional) job j has run on type k since `solution` was adopted. A job's priority on type k
// is X[j][k] / rounds_received[j][k] (a job that has not yet run there comes first, larger X
// first). All (job, type) entries with X > 0 are visited in priority order across types, and a
// job gets a type when it is not yet placed this round and scale_factor[j] devices of that type
// are still free. Devices left over then go, in the same way, to jobs that can run on them but
// have no time share there (work conservation, as Gavel's scheduler does).
//
// With single-device jobs the rounds converge to the time shares. With multi-device jobs the LP
// ignores packing, so its shares need not be deliverable exactly (a job holding 1 of 8 devices
// all the time leaves room for only one 4-device job, whatever the shares say); each round is
// still within capacity and leaves no device idle that an unplaced job could use.
//
// Returns, per job, the device type it runs on this round, or -1. Ties are broken by the larger
// time share, then the lower job index, then the lower type index, so the result is
// deterministic. InvalidArgument when the sizes do not match `problem` or a count is negative.
absl::StatusOr<std::vector<int>> AssignRound(
    const GavelProblem& problem, const GavelSolution& solution,
    const std::vector<std::vector<double>>& rounds_received);

}  // namespace tandem::cluster
