// Figures of a simulated run: job completion times (JCT), makespan, utilisation and
// finish-time fairness, plus JSON and SVG renderings.
//
// Definitions (docs/cluster.md):
//   JCT            completion - submission, per job; average, median and 99th percentile
//                  (linear interpolation between order statistics, as numpy).
//   makespan       last completion - first submission.
//   utilisation    GPU-seconds held by jobs / (GPUs x makespan).
//   finish-time    rho = JCT / T_fair (Themis, NSDI'20). T_fair is the run time on an
//   fairness       isolated 1/N share of the cluster: N = the time-averaged number of jobs in
//                  the system (submitted, unfinished, itself included) over the job's
//                  lifetime; the share is GPUs / N; a job asking for more GPUs than its share
//                  is slowed linearly: T_fair = T_alone x max(1, requested / share), with
//                  T_alone its run time alone on its requested GPUs (no restarts).
#pragma once

#include <string>

#include "cluster/simulator.h"
#include "nlohmann/json.hpp"

namespace tandem::cluster {

struct ClusterMetrics {
  int jobs = 0;
  double avg_jct_seconds = 0;
  double median_jct_seconds = 0;
  double p99_jct_seconds = 0;
  double makespan_seconds = 0;
  double utilisation = 0;
  double avg_ftf = 0;  // average rho
  double max_ftf = 0;  // worst rho
  double total_restarts = 0;
};

ClusterMetrics ComputeMetrics(const SimulationResult& result);

// Linear-interpolation percentile (0..100) of unsorted values; 0 for none.
double Percentile(std::vector<double> values, double percent);

// Per-job finish-time fairness rho, in result.jobs order.
std::vector<double> FinishTimeFairness(const SimulationResult& result);

// {"policy", "workload", "jobs", "avg_jct_seconds", "median_jct_seconds", "p99_jct_seconds",
//  "makespan_seconds", "utilisation", "avg_ftf", "max_ftf", "rounds", "jcts": {name: s}}.
nlohmann::json MetricsToJson(const SimulationResult& result, const ClusterMetrics& metrics);

// A readable summary (one figure per line).
std::string FormatMetrics(const SimulationResult& result, const ClusterMetrics& metrics);

// GPUs held by each job over time, stacked (plain SVG text).
std::string AllocationSvg(const SimulationResult& result);

}  // namespace tandem::cluster
