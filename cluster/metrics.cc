#include "cluster/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::cluster {
namespace {

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

double Percentile(std::vector<double> values, double percent) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double position = percent / 100.0 * (values.size() - 1);
  const size_t lower = static_cast<size_t>(std::floor(position));
  const size_t upper = std::min(lower + 1, values.size() - 1);
  return values[lower] + (values[upper] - values[lower]) * (position - lower);
}

std::vector<double> FinishTimeFairness(const SimulationResult& result) {
  std::vector<double> rho;
  for (const JobOutcome& job : result.jobs) {
    const double lifetime = job.completion_seconds - job.submission_seconds;
    double contenders = 1.0;
    if (lifetime > 0) {
      double overlap = 0;
      for (const JobOutcome& other : result.jobs) {
        const double start = std::max(job.submission_seconds, other.submission_seconds);
        const double end = std::min(job.completion_seconds, other.completion_seconds);
        if (end > start) overlap += end - start;
      }
      contenders = std::max(1.0, overlap / lifetime);
    }
    const double share = result.total_gpus / contenders;
    const double fair = job.isolated_seconds * std::max(1.0, job.requested_gpus / share);
    rho.push_back(fair > 0 ? job.jct_seconds / fair : 0.0);
  }
  return rho;
}

ClusterMetrics ComputeMetrics(const SimulationResult& result) {
  ClusterMetrics metrics;
  metrics.jobs = static_cast<int>(result.jobs.size());
  if (result.jobs.empty()) return metrics;
  std::vector<double> jcts;
  double first = result.jobs.front().submission_seconds, last = 0, gpu_seconds = 0;
  for (const JobOutcome& job : result.jobs) {
    jcts.push_back(job.jct_seconds);
    first = std::min(first, job.submission_seconds);
    last = std::max(last, job.completion_seconds);
    gpu_seconds += job.gpu_seconds;
    metrics.total_restarts += job.restarts;
  }
  double sum = 0;
  for (double jct : jcts) sum += jct;
  metrics.avg_jct_seconds = sum / jcts.size();
  metrics.median_jct_seconds = Percentile(jcts, 50);
  metrics.p99_jct_seconds = Percentile(jcts, 99);
  metrics.makespan_seconds = last - first;
  if (metrics.makespan_seconds > 0 && result.total_gpus > 0) {
    metrics.utilisation = gpu_seconds / (result.total_gpus * metrics.makespan_seconds);
  }
  const std::vector<double> rho = FinishTimeFairness(result);
  double rho_sum = 0;
  for (double r : rho) {
    rho_sum += r;
    metrics.max_ftf = std::max(metrics.max_ftf, r);
  }
  metrics.avg_ftf = rho_sum / rho.size();
  return metrics;
}

nlohmann::json MetricsToJson(const SimulationResult& result, const ClusterMetrics& metrics) {
  nlohmann::json j;
  j["policy"] = result.policy;
  j["workload"] = result.workload;
  j["jobs"] = metrics.jobs;
  j["total_gpus"] = result.total_gpus;
  j["rounds"] = result.rounds;
  j["avg_jct_seconds"] = metrics.avg_jct_seconds;
  j["median_jct_seconds"] = metrics.median_jct_seconds;
  j["p99_jct_seconds"] = metrics.p99_jct_seconds;
  j["makespan_seconds"] = metrics.makespan_seconds;
  j["utilisation"] = metrics.utilisation;
  j["avg_ftf"] = metrics.avg_ftf;
  j["max_ftf"] = metrics.max_ftf;
  j["restarts"] = metrics.total_restarts;
  nlohmann::json jcts = nlohmann::json::object();
  for (const JobOutcome& job : result.jobs) jcts[job.name] = job.jct_seconds;
  j["jcts"] = std::move(jcts);
  return j;
}

std::string FormatMetrics(const SimulationResult& result, const ClusterMetrics& metrics) {
  return absl::StrFormat(
      "policy %s on %s: %d jobs, %d GPUs, %d rounds\n"
      "  average JCT     %10.0f s  (%.3f h)\n"
      "  median JCT      %10.0f s  (%.3f h)\n"
      "  p99 JCT         %10.0f s  (%.3f h)\n"
      "  makespan        %10.0f s  (%.3f h)\n"
      "  utilisation     %10.3f\n"
      "  finish-time fairness rho: average %.3f, max %.3f\n"
      "  restarts        %10.0f\n",
      result.policy, result.workload, metrics.jobs, result.total_gpus, result.rounds,
      metrics.avg_jct_seconds, metrics.avg_jct_seconds / 3600, metrics.median_jct_seconds,
      metrics.median_jct_seconds / 3600, metrics.p99_jct_seconds, metrics.p99_jct_seconds / 3600,
      metrics.makespan_seconds, metrics.makespan_seconds / 3600, metrics.utilisation,
      metrics.avg_ftf, metrics.max_ftf, metrics.total_restarts);
}

std::string AllocationSvg(const SimulationResult& result) {
  constexpr double kWidth = 1000, kHeight = 400, kLeft = 60, kTop = 30, kBottom = 40;
  double end = result.interval_seconds;
  for (const TimelineEntry& entry : result.timeline) {
    end = std::max(end, entry.start_seconds + result.interval_seconds);
  }
  const double gpus = std::max(1, result.total_gpus);
  const double x_scale = kWidth / end, y_scale = kHeight / gpus;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<text x=\"%.0f\" y=\"18\">GPUs per job over time: %s, %s</text>\n"
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
      "stroke=\"#888\"/>\n",
      kLeft + kWidth + 20, kTop + kHeight + kBottom, kLeft, XmlEscape(result.policy),
      XmlEscape(result.workload), kLeft,
      kTop, kWidth, kHeight);
  // Merge a job's consecutive intervals at the same stack offset and height into one rect.
  struct Open {
    double start, end;
    int offset, count;
  };
  std::map<int, Open> open;
  auto colour = [](int job) {
    return absl::StrFormat("hsl(%d,65%%,55%%)", (job * 137) % 360);
  };
  auto flush = [&](int job, const Open& o) {
    absl::StrAppend(
        &svg, absl::StrFormat("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                              "fill=\"%s\"><title>%s: %d GPUs</title></rect>\n",
                              kLeft + o.start * x_scale,
                              kTop + kHeight - (o.offset + o.count) * y_scale,
                              (o.end - o.start) * x_scale, o.count * y_scale, colour(job),
                              XmlEscape(job < static_cast<int>(result.jobs.size()) ? result.jobs[job].name
                                                                                   : "?"),
                              o.count));
  };
  for (const TimelineEntry& entry : result.timeline) {
    int offset = 0;
    std::map<int, Open> next;
    for (const auto& [job, count] : entry.gpus) {
      const double start = entry.start_seconds, stop = start + result.interval_seconds;
      auto found = open.find(job);
      if (found != open.end() && found->second.offset == offset &&
          found->second.count == count && std::fabs(found->second.end - start) < 1e-9) {
        Open merged = found->second;
        merged.end = stop;
        next[job] = merged;
        open.erase(found);
      } else {
        next[job] = Open{start, stop, offset, count};
      }
      offset += count;
    }
    for (const auto& [job, o] : open) flush(job, o);
    open = std::move(next);
  }
  for (const auto& [job, o] : open) flush(job, o);
  for (int tick = 0; tick <= 4; ++tick) {
    const double t = end * tick / 4;
    absl::StrAppend(&svg, absl::StrFormat(
                              "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.1f h</text>\n",
                              kLeft + t * x_scale, kTop + kHeight + 18, t / 3600));
  }
  absl::StrAppend(&svg, absl::StrFormat(
                            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%d GPUs</text>\n"
                            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">0</text>\n</svg>\n",
                            kLeft - 6, kTop + 12, result.total_gpus, kLeft - 6, kTop + kHeight));
  return svg;
}

}  // namespace tandem::cluster
