// SVG Gantt charts of simulated timelines: one row per rank, F, B, Bi and W in distinct
// colours, a time axis and a legend.
//
// Up to kMaxDrawnBoxes computes every box is drawn, labelled ("F3.1") where it is wide enough,
// with its name and duration as a tooltip. A larger timeline is binned: at p=1024, m=4096 a
// ZB-V chart has 25 M computes, about 30 per pixel, which as boxes would be gigabytes of SVG
// that no viewer opens. Each pixel column of a rank's row is then drawn in the colour of the
// type that fills more than half of its busy time, dark grey for a mix of types (ZB-V's
// steady state), and left blank when it is idle more than half the time; runs of equal columns are
// one box, so the file stays a few megabytes however long the schedule, and the bubbles show.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace tandem::pipeline {

class GanttSvg {
 public:
  static constexpr int64_t kMaxDrawnBoxes = 100'000;

  // `boxes`: how many compute boxes will be added, or a bound on it (see ComputeBoxes); more
  // than kMaxDrawnBoxes are binned.
  GanttSvg(int num_ranks, double makespan_seconds, double bubble_ratio, int64_t boxes);

  // One box of the compute lane.
  void AddBox(int rank, double start_seconds, double duration_seconds,
              absl::string_view category, absl::string_view name);
  // An interval streamed from a simulation of `schedule` (SimulationOptions::on_interval):
  // its compute lane is drawn, the other lanes are not.
  void Add(const Schedule& schedule, const SimulatedInterval& interval);

  std::string Render() const;
  bool binned() const { return binned_; }

  // A bound on the compute boxes of a schedule's chart: its computes and optimizer steps.
  static int64_t ComputeBoxes(const Schedule& schedule);

 private:
  double RowTop(int rank) const { return kTop + rank * (row_height_ + row_gap_); }

  static constexpr double kChartWidth = 1200;
  static constexpr double kLabelWidth = 70;
  static constexpr double kTop = 30;

  int num_ranks_;
  double makespan_;
  double bubble_ratio_;
  double scale_;  // pixels per second
  double row_height_;
  double row_gap_;
  int label_every_;  // label every n-th rank's row
  bool binned_;
  std::string boxes_;  // drawn boxes' SVG
  // Binned: per rank and column, the seconds of each category in it.
  int columns_ = 0;
  std::vector<float> busy_;  // [(rank * columns_ + column) * kCategories + category]
  int64_t binned_boxes_ = 0;
};

// The chart of a recorded trace (SimulationOptions::record_trace).
std::string RenderSvgGantt(const SimulationResult& result, int num_ranks);

}  // namespace tandem::pipeline
