#include "pipeline/simulator.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "common/file_util.h"
#include "pipeline/gantt.h"
#include "pipeline/generators.h"
#include "pipeline/validator.h"
#include "tests/pipeline/test_util.h"

namespace tandem::pipeline {
namespace {

constexpr double kTolerance = 1e-9;

using testing::Spec;

SimulationResult SimulateUniform(const ScheduleSpec& spec, double forward, double backward,
                     double weight = 0) {
  auto schedule = GenerateSchedule(spec);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  auto result = Simulate(*schedule, CostModel::Uniform(schedule->spec, forward, backward, weight));
  EXPECT_TRUE(result.ok()) << result.status();
  return *result;
}

// The checks of the issue, derived by hand from each schedule's rules (zero communication).

TEST(SimulatorTest, GPipeAnd1F1B) {
  // Both: (m + p - 1) * (F + B) = 11 * 3; bubble (p-1)/(m+p-1) = 3/11.
  SimulationResult gpipe = SimulateUniform(Spec(ScheduleKind::kGPipe, 4, 8), 1, 2);
  SimulationResult onef1b = SimulateUniform(Spec(ScheduleKind::k1F1B, 4, 8), 1, 2);
  EXPECT_NEAR(gpipe.makespan_seconds, 33, kTolerance);
  EXPECT_NEAR(onef1b.makespan_seconds, 33, kTolerance);
  EXPECT_NEAR(gpipe.bubble_ratio, 3.0 / 11, kTolerance);
  EXPECT_NEAR(onef1b.bubble_ratio, 3.0 / 11, kTolerance);
  EXPECT_EQ(onef1b.peak_activations, (std::vector<double>{4, 3, 2, 1}));
  EXPECT_EQ(gpipe.peak_activations, (std::vector<double>{8, 8, 8, 8}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(onef1b.busy_seconds[r], 24, kTolerance);
    EXPECT_NEAR(onef1b.idle_seconds[r], 9, kTolerance);
  }
  EXPECT_EQ(onef1b.simulated_actions,
            Generate1F1B(4, 8)->NumActions());
}

TEST(SimulatorTest, Interleaved) {
  // Chunks take F=0.5, B=1; bubble (p-1)/v * (F+B) = 4.5 on top of m * (F+B) = 24.
  SimulationResult r = SimulateUniform(Spec(ScheduleKind::kInterleaved, 4, 8, 2), 1, 2);
  EXPECT_NEAR(r.makespan_seconds, 28.5, kTolerance);
  // Megatron's warm-up: rank 0 holds (p-1)*2 + (v-1)*p + 1 = 11 chunks of half a stage.
  EXPECT_NEAR(r.peak_activations[0], 5.5, kTolerance);
}

TEST(SimulatorTest, ZeroBubbleH1) {
  // m (F+B+W) + (p-1)(F+B-W) = 24 + 3.
  SimulationResult zb = SimulateUniform(Spec(ScheduleKind::kZBH1, 4, 8), 1, 1, 1);
  EXPECT_NEAR(zb.makespan_seconds, 27, kTolerance);
  // Same activation memory as 1F1B's first stage on every rank.
  EXPECT_EQ(zb.peak_activations, (std::vector<double>{4, 4, 4, 4}));
  SimulationResult onef1b = SimulateUniform(Spec(ScheduleKind::k1F1B, 4, 8), 1, 1, 1);
  EXPECT_NEAR(onef1b.makespan_seconds, 33, kTolerance);
}

TEST(SimulatorTest, Chimera) {
  // D=4, 2 micro-batches per direction: 2m + D - 2 = 10; busy 8 of 10 per rank.
  SimulationResult r = SimulateUniform(Spec(ScheduleKind::kChimera, 4, 4), 1, 1);
  EXPECT_NEAR(r.makespan_seconds, 10, kTolerance);
  EXPECT_NEAR(r.bubble_ratio, 0.2, kTolerance);
  // Basic unit repeated: with m = 2D the second unit fills the first one's drain.
  EXPECT_NEAR(SimulateUniform(Spec(ScheduleKind::kChimera, 4, 8), 1, 1).makespan_seconds, 18, kTolerance);
  // With B = 2F the best order for D=4, m=4 takes 16 (15 is infeasible by exhaustive search).
  EXPECT_NEAR(SimulateUniform(Spec(ScheduleKind::kChimera, 4, 4), 1, 2).makespan_seconds, 16, kTolerance);
}

TEST(SimulatorTest, BubbleRatioFormulasOverAGrid) {
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {1, 3, 8, 16}) {
      SimulationResult r = SimulateUniform(Spec(ScheduleKind::k1F1B, p, m), 1, 2);
      EXPECT_NEAR(r.bubble_ratio, double(p - 1) / (m + p - 1), kTolerance)
          << "1f1b p=" << p << " m=" << m;
    }
    for (int groups : {1, 2, 4}) {
      const int m = groups * p;  // Megatron's formula holds for whole groups of p
      for (int v : {2, 3, 4}) {
        SimulationResult r = SimulateUniform(Spec(ScheduleKind::kInterleaved, p, m, v), 1, 2);
        EXPECT_NEAR(r.bubble_ratio, double(p - 1) / (v * m + p - 1), kTolerance)
            << "interleaved p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(SimulatorTest, SchedulesThatBeat1F1B) {
  for (auto [p, m] : {std::pair{4, 8}, {4, 16}, {8, 16}, {8, 32}}) {
    const double onef1b = SimulateUniform(Spec(ScheduleKind::k1F1B, p, m), 1, 2).makespan_seconds;
    for (int waves : {1, 2}) {
      SimulationResult hanayo = SimulateUniform(Spec(ScheduleKind::kHanayo, p, m, 1, waves), 1, 2);
      EXPECT_LT(hanayo.makespan_seconds, onef1b) << "hanayo p=" << p << " m=" << m;
      // Activation cap: 1.5x a 1F1B first stage (p units).
      for (double peak : hanayo.peak_activations) EXPECT_LE(peak, 1.5 * p + kTolerance);
    }
    // ZB-V with F = B = W: close to zero bubble, within 1F1B's activation memory.
    SimulationResult zbv = SimulateUniform(Spec(ScheduleKind::kZBV, p, m), 1, 1, 1);
    EXPECT_LT(zbv.makespan_seconds, 3.0 * m + p) << "zb-v p=" << p << " m=" << m;
    for (double peak : zbv.peak_activations) EXPECT_LE(peak, p + kTolerance);
  }
}

// Two-stage schedules by hand, for communication and synchronisation costs.
Schedule TwoStagesOneMicrobatch() {
  auto s = GenerateGPipe(2, 1);
  EXPECT_TRUE(s.ok());
  return *s;
}

TEST(SimulatorTest, HeterogeneousStageCosts) {
  // 1F1B, p=2, m=4, stage 1 twice as slow: rank 1 is busy m * (2 + 2) from t=1, then the last
  // backward of stage 0: 1 + 16 + 1.
  ScheduleSpec spec = Spec(ScheduleKind::k1F1B, 2, 4);
  auto costs = CostModel::FromStageCosts(spec, {1, 2}, {1, 2});
  ASSERT_TRUE(costs.ok()) << costs.status();
  auto result = Simulate(*Generate1F1B(2, 4), *costs);
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->makespan_seconds, 18, kTolerance);
  EXPECT_NEAR(result->busy_seconds[0], 8, kTolerance);
  EXPECT_NEAR(result->busy_seconds[1], 16, kTolerance);
  auto bad = CostModel::FromStageCosts(spec, {1, 2, 3}, {1, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "forward: expected 2 values"));
  bad = CostModel::FromStageCosts(spec, {1, -2}, {1, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "forward[1]"));
}

TEST(SimulatorTest, PointToPointCost) {
  // F0 [0,1], activation arrives at 1 + latency + bytes/bandwidth = 2.5, F1 [2.5,3.5],
  // B1 [3.5,4.5], gradient arrives at 6, B0 [6,7].
  Schedule s = TwoStagesOneMicrobatch();
  CostModel costs = CostModel::Uniform(s.spec, 1, 1);
  costs.p2p_latency_seconds = 0.5;
  costs.p2p_bandwidth_bytes_per_second = 1e6;
  costs.stages[0].activation_bytes = 1e6;
  auto result = Simulate(s, costs);
  ASSERT_TRUE(result.ok());
  EXPECT_NEAR(result->makespan_seconds, 7, kTolerance);
  EXPECT_NEAR(result->bubble_ratio, 1 - 4.0 / 14, kTolerance);
}

TEST(SimulatorTest, GradientSyncAndOptimizer) {
  // Stage 0's last backward ends at 4; its sync takes 3 more, then the optimizer 0.5.
  Schedule s = TwoStagesOneMicrobatch();
  CostModel costs = CostModel::Uniform(s.spec, 1, 1);
  costs.grad_sync_seconds = {3, 10};
  costs.optimizer_seconds = 0.5;
  auto result = Simulate(s, costs);
  ASSERT_TRUE(result.ok());
  // Stage 1: B1 ends at 3, sync ends at 13, step ends at 13.5.
  EXPECT_NEAR(result->makespan_seconds, 13.5, kTolerance);
  costs.grad_sync_seconds = {3};
  EXPECT_FALSE(Simulate(s, costs).ok());
}

TEST(SimulatorTest, CostsMustMatchTheSchedule) {
  Schedule s = TwoStagesOneMicrobatch();
  ScheduleSpec other = Spec(ScheduleKind::kInterleaved, 2, 1, 2);
  auto result = Simulate(s, CostModel::Uniform(other, 1, 1));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "costs for 4 stages")) << result.status();
}

TEST(SimulatorTest, DeadlockIsReported) {
  Schedule s = TwoStagesOneMicrobatch();
  // Swap rank 0's send and receive: it now waits for a gradient before sending.
  std::swap(s.programs[0][1], s.programs[0][2]);
  auto result = Simulate(s, CostModel::Uniform(s.spec, 1, 1));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "rank 0 step 1 (rG1.0<1)"))
      << result.status();
}

TEST(SimulatorTest, TraceAndSvg) {
  auto s = Generate1F1B(2, 2);
  ASSERT_TRUE(s.ok());
  SimulationOptions options;
  options.record_trace = true;
  CostModel costs = CostModel::Uniform(s->spec, 1, 2);
  costs.p2p_latency_seconds = 0.25;
  auto result = Simulate(*s, costs, options);
  ASSERT_TRUE(result.ok());
  int compute = 0;
  bool found = false;
  for (const TraceEvent& e : result->trace.events()) {
    if (e.tid != kTraceLaneCompute) continue;
    ++compute;
    if (e.name == "F1.1") {
      found = true;
      EXPECT_EQ(e.pid, 1);
      EXPECT_EQ(e.category, "forward");
    }
  }
  EXPECT_EQ(compute, 8);  // 2 ranks x 2 micro-batches x (F + B)
  EXPECT_TRUE(found);
  nlohmann::json j = result->trace.ToJson();
  EXPECT_TRUE(j.contains("traceEvents"));
  std::string svg = RenderSvgGantt(*result, 2);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg"));
  EXPECT_TRUE(absl::StrContains(svg, ">F1.1</text>")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, "#59a14f"));  // backward colour
  EXPECT_TRUE(absl::StrContains(svg, "rank 1"));
}

// tandem schedule's --trace streams the timeline (SimulatedTraceFile fed by on_interval)
// instead of holding it: the file holds exactly the events record_trace collects, every lane
// included (waits and transfers with a latency, syncs and the optimizer step with costs).
TEST(SimulatorTest, StreamedTraceEqualsTheRecordedOne) {
  for (const ScheduleSpec& spec : {Spec(ScheduleKind::kZBV, 4, 8), Spec(ScheduleKind::kDualPipe, 4, 8),
                                   Spec(ScheduleKind::kInterleaved, 4, 8, 2)}) {
    auto s = GenerateSchedule(spec);
    ASSERT_TRUE(s.ok()) << s.status();
    CostModel costs = CostModel::Uniform(s->spec, 1, 1.5, 0.5);
    costs.p2p_latency_seconds = 0.125;
    costs.grad_sync_seconds.assign(s->spec.NumStages(), 0.75);
    costs.optimizer_seconds = 0.25;
    SimulationOptions recorded;
    recorded.record_trace = true;
    auto expected = Simulate(*s, costs, recorded);
    ASSERT_TRUE(expected.ok()) << expected.status();

    const std::string path = absl::StrCat(::testing::TempDir(), "/streamed_trace.json");
    auto file = SimulatedTraceFile::Open(path, *s);
    ASSERT_TRUE(file.ok()) << file.status();
    SimulationOptions streamed;
    int64_t intervals = 0;
    streamed.on_interval = [&](const SimulatedInterval& interval) {
      file->Add(interval);
      ++intervals;
    };
    auto result = Simulate(*s, costs, streamed);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->trace.events().empty());  // nothing held
    EXPECT_EQ(intervals, static_cast<int64_t>(expected->trace.events().size()));
    ASSERT_TRUE(file->Close().ok());
    auto text = ReadFile(path);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(nlohmann::json::parse(*text), expected->trace.ToJson()) << ScheduleKindName(spec.kind);
    int lanes = 0;
    for (int lane : {kTraceLaneWait, kTraceLaneTransfer, kTraceLaneSync}) {
      for (const TraceEvent& e : expected->trace.events()) {
        if (e.tid == lane) {
          ++lanes;
          break;
        }
      }
    }
    EXPECT_EQ(lanes, 3) << "every lane is compared";
    std::remove(path.c_str());
  }
}

// Past GanttSvg::kMaxDrawnBoxes computes the chart bins pixel columns. GPipe at p=32, m=4096
// (262,144 computes, about 7 per column): the file stays small, and the fill shows: rank r's
// first drawn column is the first that its forwards, starting r seconds in, fill half of.
TEST(SimulatorTest, LargeChartsAreBinnedAndKeepTheirShape) {
  auto s = GenerateGPipe(32, 4096);
  ASSERT_TRUE(s.ok());
  const CostModel costs = CostModel::Uniform(s->spec, 1, 2);
  auto result = Simulate(*s, costs);
  ASSERT_TRUE(result.ok());
  ASSERT_GT(GanttSvg::ComputeBoxes(*s), GanttSvg::kMaxDrawnBoxes);
  GanttSvg chart(s->NumRanks(), result->makespan_seconds, result->bubble_ratio,
                 GanttSvg::ComputeBoxes(*s));
  EXPECT_TRUE(chart.binned());
  SimulationOptions options;
  options.on_interval = [&](const SimulatedInterval& i) { chart.Add(*s, i); };
  ASSERT_TRUE(Simulate(*s, costs, options).ok());
  const std::string svg = chart.Render();
  EXPECT_LT(svg.size(), 100'000u);
  EXPECT_TRUE(absl::StrContains(svg, "262144 computes, too many to draw one by one")) << svg;
  // Rows are 26 px high with 4 between (rank r's boxes at y = 30 + 30 r), columns 1 px from
  // x = 70.
  auto first_x = [&](int rank) {
    const std::string y = absl::StrCat("y=\"", 30 + 30 * rank, ".0\"");
    for (absl::string_view line : absl::StrSplit(svg, '\n')) {
      if (absl::StartsWith(line, "<rect x=") && absl::StrContains(line, y) &&
          absl::StrContains(line, "<title>")) {
        return std::stod(std::string(line.substr(9)));
      }
    }
    return -1.0;
  };
  const double column = result->makespan_seconds / 1200;
  for (int rank : {0, 9, 20, 31}) {
    const int c = static_cast<int>(rank / column);
    const int expected = (c + 1) * column - rank >= column / 2 ? c : c + 1;
    EXPECT_DOUBLE_EQ(first_x(rank), 70 + expected) << "rank " << rank;
  }
  EXPECT_GT(first_x(31), 71);  // the fill is visible: at least two blank columns
  // A small schedule's chart is drawn box by box.
  auto small = Generate1F1B(2, 2);
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(GanttSvg(2, 6, 0.25, GanttSvg::ComputeBoxes(*small)).binned());
}

TEST(SimulatorTest, CostsFromJson) {
  ScheduleSpec spec = Spec(ScheduleKind::k1F1B, 2, 4);
  auto costs = CostModel::FromJson(
      nlohmann::json::parse(R"({"forward": [1, 2], "backward": [1, 2],
                                 "activation_bytes": [100, 0], "latency_seconds": 0.1})"),
      spec, "c.json");
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_DOUBLE_EQ(costs->stages[1].forward_seconds, 2);
  EXPECT_DOUBLE_EQ(costs->stages[0].activation_bytes, 100);
  EXPECT_DOUBLE_EQ(costs->p2p_latency_seconds, 0.1);
  for (auto [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"backward": [1, 2]})", "c.json.forward: missing field"},
           {R"({"forward": [1, "x"], "backward": [1, 2]})", "c.json.forward[1]: expected a number"},
           {R"({"forward": [1], "backward": [1, 2]})", "c.json: forward: expected 2 values"},
           {R"({"forward": [1, 1], "backward": [1, 2], "latency_seconds": -1})",
            "latency_seconds"},
           {R"([1, 2])", "c.json: expected a JSON object"}}) {
    auto bad = CostModel::FromJson(nlohmann::json::parse(text), spec, "c.json");
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_TRUE(absl::StrContains(bad.status().message(), expected))
        << bad.status() << " expected " << expected;
  }
}

TEST(SimulatorTest, ReusedSimulatorGivesTheSameResult) {
  auto s = GenerateInterleaved(4, 8, 2);
  ASSERT_TRUE(s.ok());
  auto sim = ScheduleSimulator::Create(*s);
  ASSERT_TRUE(sim.ok());
  auto a = sim->Run(CostModel::Uniform(s->spec, 1, 2));
  auto b = sim->Run(CostModel::Uniform(s->spec, 2, 4));
  auto c = sim->Run(CostModel::Uniform(s->spec, 1, 2));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NEAR(a->makespan_seconds, 28.5, kTolerance);
  EXPECT_NEAR(b->makespan_seconds, 57, kTolerance);
  EXPECT_EQ(a->makespan_seconds, c->makespan_seconds);
}

}  // namespace
}  // namespace tandem::pipeline
