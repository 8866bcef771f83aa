#include "pipeline/gantt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::pipeline {
namespace {

constexpr double kAxisHeight = 30;
constexpr double kLegendHeight = 24;
constexpr double kCharWidth = 6.5;  // at font-size 11
// Rows of up to this many ranks are 26 pixels high, each labelled; more ranks get 8-pixel rows
// with every 16th labelled (1,024 ranks: 9,200 pixels instead of 30,700).
constexpr int kTallRowsUpTo = 64;
// Binned charts keep at most this many per-column figures (64 MB): fewer columns when ranks
// are very many.
constexpr int64_t kMaxBinnedCells = int64_t{16} << 20;

// What a chart colours: compute types and the optimizer step; anything else is "other".
constexpr const char* kCategories[] = {"forward",         "backward", "backward-input",
                                       "backward-weight", "sync",     "optimizer"};
constexpr int kCategoryCount = sizeof(kCategories) / sizeof(kCategories[0]);
constexpr int kOther = kCategoryCount;
constexpr int kCells = kCategoryCount + 1;
// A binned column busy with several types, none of them filling more than half of its busy
// time (ZB-V's steady state: F, Bi and W a third each), is drawn as "mixed".
constexpr int kMixed = kCells;

int CategoryIndex(absl::string_view category) {
  for (int c = 0; c < kCategoryCount; ++c) {
    if (category == kCategories[c]) return c;
  }
  return kOther;
}

const char* FillColour(absl::string_view category) {
  if (category == "forward") return "#4e79a7";
  if (category == "backward") return "#59a14f";
  if (category == "backward-input") return "#f28e2b";
  if (category == "backward-weight") return "#b07aa1";
  if (category == "sync") return "#bab0ac";
  if (category == "optimizer") return "#e15759";
  if (category == "mixed") return "#555555";
  return "#9c9c9c";
}

std::string EscapeXml(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
double TickStep(double span, int target) {
  if (span <= 0) return 1;
  double raw = span / target;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= f * power) return f * power;
  }
  return 10 * power;
}

}  // namespace

GanttSvg::GanttSvg(int num_ranks, double makespan_seconds, double bubble_ratio, int64_t boxes)
    : num_ranks_(std::max(num_ranks, 0)),
      makespan_(makespan_seconds),
      bubble_ratio_(bubble_ratio),
      scale_(kChartWidth / (makespan_seconds > 0 ? makespan_seconds : 1)),
      row_height_(num_ranks_ <= kTallRowsUpTo ? 26 : 8),
      row_gap_(num_ranks_ <= kTallRowsUpTo ? 4 : 1),
      label_every_(num_ranks_ <= kTallRowsUpTo ? 1 : 16),
      binned_(boxes > kMaxDrawnBoxes) {
  if (binned_ && num_ranks_ > 0) {
    columns_ = static_cast<int>(std::clamp<int64_t>(kMaxBinnedCells / (kCells * num_ranks_), 1,
                                                    static_cast<int64_t>(kChartWidth)));
    busy_.assign(static_cast<size_t>(num_ranks_) * columns_ * kCells, 0.0f);
  }
}

void GanttSvg::AddBox(int rank, double start_seconds, double duration_seconds,
                      absl::string_view category, absl::string_view name) {
  if (rank < 0 || rank >= num_ranks_) return;
  if (!binned_) {
    const double x = kLabelWidth + start_seconds * scale_;
    const double w = std::max(duration_seconds * scale_, 0.5);
    const double y = RowTop(rank);
    absl::StrAppendFormat(&boxes_,
                          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                          "stroke=\"white\" stroke-width=\"0.5\"><title>%s %.6g s</title></rect>\n",
                          x, y, w, row_height_, FillColour(category), EscapeXml(name),
                          duration_seconds);
    if (w >= kCharWidth * name.size() + 4) {
      absl::StrAppendFormat(&boxes_,
                            "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" "
                            "text-anchor=\"middle\">%s</text>\n",
                            x + w / 2, y + row_height_ * 0.65, EscapeXml(name));
    }
    return;
  }
  // Spread the box's time over the columns it covers (in column units).
  ++binned_boxes_;
  const double per_column = columns_ / kChartWidth * scale_;  // columns per second
  const double x0 = std::max(start_seconds * per_column, 0.0);
  const double x1 = std::min((start_seconds + duration_seconds) * per_column,
                             static_cast<double>(columns_));
  if (!(x1 > x0)) return;
  float* cells = &busy_[static_cast<size_t>(rank) * columns_ * kCells];
  const int category_index = CategoryIndex(category);
  const int last = std::min(static_cast<int>(std::ceil(x1)) - 1, columns_ - 1);
  for (int c = static_cast<int>(x0); c <= last; ++c) {
    const double overlap = std::min(x1, c + 1.0) - std::max(x0, static_cast<double>(c));
    if (overlap > 0) cells[c * kCells + category_index] += static_cast<float>(overlap);
  }
}

void GanttSvg::Add(const Schedule& schedule, const SimulatedInterval& interval) {
  if (interval.lane != kTraceLaneCompute) return;
  const Action& a = schedule.programs[interval.rank][interval.step];
  // Binned boxes have no name: none is made for them.
  AddBox(interval.rank, interval.start_seconds, interval.duration_seconds,
         TraceCategory(a.type), binned_ ? absl::string_view() : ToString(a));
}

int64_t GanttSvg::ComputeBoxes(const Schedule& schedule) {
  int64_t boxes = 0;
  for (const auto& program : schedule.programs) {
    for (const Action& a : program) {
      boxes += IsCompute(a.type) || a.type == ActionType::kOptimizerStep;
    }
  }
  return boxes;
}

std::string GanttSvg::Render() const {
  const double rows_height = num_ranks_ * (row_height_ + row_gap_);
  const double width = kLabelWidth + kChartWidth + 20;
  const double height = kTop + rows_height + kAxisHeight + kLegendHeight + 10;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"18\" font-size=\"%s\">makespan %.6g s, bubble ratio %.4f%s</text>\n",
      width, height, kLabelWidth, binned_ ? "11" : "13", makespan_, bubble_ratio_,
      binned_ ? absl::StrCat("; ", binned_boxes_,
                             " computes, too many to draw one by one: each pixel column shows "
                             "the type that fills most of its busy time, or dark grey for a "
                             "mix")
              : "");
  for (int r = 0; r < num_ranks_; ++r) {
    const double y = RowTop(r);
    if (r % label_every_ == 0) {
      absl::StrAppendFormat(&svg, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n",
                            y + std::max(row_height_ * 0.65, 8.0), r);
    }
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"#f4f4f4\"/>\n",
                          kLabelWidth, y, kChartWidth, row_height_);
  }
  svg += boxes_;
  if (binned_) {
    const double column_width = kChartWidth / columns_;
    for (int r = 0; r < num_ranks_; ++r) {
      const float* cells = &busy_[static_cast<size_t>(r) * columns_ * kCells];
      // The colour of each column (-1: mostly idle), runs of one colour drawn as one box.
      auto colour_of = [&](int c) {
        const float* cell = &cells[c * kCells];
        float total = 0, most = 0;
        int best = -1;
        for (int k = 0; k < kCells; ++k) {
          total += cell[k];
          if (cell[k] > most) {
            most = cell[k];
            best = k;
          }
        }
        if (total < 0.5f) return -1;
        return most > 0.5f * total ? best : kMixed;
      };
      for (int c = 0; c < columns_;) {
        const int colour = colour_of(c);
        int end = c + 1;
        while (end < columns_ && colour_of(end) == colour) ++end;
        if (colour >= 0) {
          const char* category = colour == kMixed             ? "mixed"
                                 : colour < kCategoryCount ? kCategories[colour]
                                                           : "other";
          absl::StrAppendFormat(&svg,
                                "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                                "fill=\"%s\"><title>%s</title></rect>\n",
                                kLabelWidth + c * column_width, RowTop(r),
                                (end - c) * column_width, row_height_, FillColour(category),
                                category);
        }
        c = end;
      }
    }
  }
  // Time axis.
  const double axis_y = kTop + rows_height + 4;
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                        kLabelWidth, axis_y, kLabelWidth + kChartWidth, axis_y);
  const double span = kChartWidth / scale_;
  const double step = TickStep(span, 10);
  for (double t = 0; t <= span * (1 + 1e-9); t += step) {
    const double x = kLabelWidth + t * scale_;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.6g</text>\n",
                          x, axis_y, x, axis_y + 5, x, axis_y + 17, t);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.1f\">seconds</text>\n",
                        kLabelWidth + kChartWidth - 50, axis_y + 28);
  // Legend.
  double lx = kLabelWidth;
  const double ly = axis_y + kAxisHeight + 4;
  for (auto [category, label] :
       {std::pair<const char*, const char*>{"forward", "F forward"},
        {"backward", "B backward"},
        {"backward-input", "Bi input gradient"},
        {"backward-weight", "W weight gradient"},
        {"optimizer", "optimizer step"}}) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%.1f\">%s</text>\n",
                          lx, ly, FillColour(category), lx + 16, ly + 10, label);
    lx += 140;
  }
  if (binned_) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%.1f\">mixed</text>\n",
                          lx, ly, FillColour("mixed"), lx + 16, ly + 10);
  }
  svg += "</svg>\n";
  return svg;
}

std::string RenderSvgGantt(const SimulationResult& result, int num_ranks) {
  int64_t boxes = 0;
  for (const TraceEvent& e : result.trace.events()) boxes += e.tid == kTraceLaneCompute;
  GanttSvg chart(num_ranks, result.makespan_seconds, result.bubble_ratio, boxes);
  for (const TraceEvent& e : result.trace.events()) {
    if (e.tid != kTraceLaneCompute) continue;
    chart.AddBox(e.pid, e.start_seconds, e.duration_seconds, e.category, e.name);
  }
  return chart.Render();
}

}  // namespace tandem::pipeline
