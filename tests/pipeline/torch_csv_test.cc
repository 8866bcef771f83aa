// torch.distributed.pipelining's CSV schedules: files written by torch are read (shape,
// placement, validator, simulator) and written back as torch wrote them less what tandem's IR
// does not hold; tandem's own schedules round-trip exactly; bad files fail with one line.
#include "pipeline/torch_csv.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"

namespace tandem::pipeline {
namespace {

std::string DataPath(const std::string& name) {
  return absl::StrCat(TANDEM_TORCH_SCHEDULES_DIR, "/", name);
}

std::string ReadData(const std::string& name) {
  auto text = ReadFile(DataPath(name));
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// What tandem writes back of a torch file: the same rows less the idle (empty) cells and
// torch's bookkeeping cells, with OVERLAP_F_B written as its actions.
std::string WithoutWhatTandemDoesNotHold(const std::string& text) {
  std::vector<std::string> rows;
  for (absl::string_view row : absl::StrSplit(text, "\r\n")) {
    if (row.empty()) continue;
    std::vector<std::string> cells;
    for (absl::string_view cell : absl::StrSplit(row, ',')) {
      if (cell.empty() || absl::StrContains(cell, "UNSHARD") ||
          absl::StrContains(cell, "RESHARD") || absl::StrContains(cell, "WAIT_")) {
        continue;
      }
      if (absl::ConsumeSuffix(&cell, "OVERLAP_F_B")) {
        cell.remove_prefix(1);
        cell.remove_suffix(1);
        for (absl::string_view part : absl::StrSplit(cell, ';')) cells.emplace_back(part);
        continue;
      }
      cells.emplace_back(cell);
    }
    rows.push_back(absl::StrJoin(cells, ","));
  }
  return absl::StrCat(absl::StrJoin(rows, "\r\n"), "\r\n");
}

struct TorchFile {
  const char* name;
  int ranks;
  int microbatches;
  int chunks;
  bool wave;
};

constexpr TorchFile kTorchFiles[] = {
    {"interleaved1f1b_p4_m8", 4, 8, 2, false}, {"interleaved1f1b_p2_m6", 2, 6, 2, false},
    {"loopedbfs_p2_m4", 2, 4, 2, false},       {"interleavedzb_p4_m8", 4, 8, 2, false},
    {"zbv_p4_m8", 4, 8, 2, true},              {"zbv_p2_m4", 2, 4, 2, true},
    {"dualpipev_p4_m8", 4, 8, 2, true},
};

TEST(TorchCsvTest, ReadsValidatesSimulatesAndWritesBackTorchsFiles) {
  for (const TorchFile& f : kTorchFiles) {
    for (bool lowered : {false, true}) {
      const std::string name = absl::StrCat(f.name, lowered ? "_comms" : "", ".csv");
      SCOPED_TRACE(name);
      const std::string text = ReadData(name);
      EXPECT_EQ(TorchCsvHasCommunication(text), lowered);
      auto schedule = ReadTorchCsvSchedule(DataPath(name));
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      EXPECT_EQ(schedule->spec.kind, ScheduleKind::kCustom);
      EXPECT_EQ(schedule->spec.num_ranks, f.ranks);
      EXPECT_EQ(schedule->spec.num_microbatches, f.microbatches);
      EXPECT_EQ(schedule->spec.chunks, f.chunks);
      EXPECT_EQ(schedule->spec.wave_placement, f.wave);
      EXPECT_TRUE(ValidateSchedule(*schedule).ok());
      // Every rank does 2 chunks x m micro-batches of F and of B (split or not): with a
      // forward of 1 and a backward of 2 per stage, 3m per rank at least.
      auto result = Simulate(*schedule, CostModel::Uniform(schedule->spec, 1.0, 2.0));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_GE(result->makespan_seconds, 3.0 * f.microbatches);
      for (double busy : result->busy_seconds) EXPECT_DOUBLE_EQ(busy, 3.0 * f.microbatches);
      auto written = FormatTorchCsvSchedule(
          *schedule, lowered ? TorchCsvForm::kWithCommunication : TorchCsvForm::kComputeOnly);
      ASSERT_TRUE(written.ok()) << written.status();
      EXPECT_EQ(*written, WithoutWhatTandemDoesNotHold(text));
    }
  }
}

// torch's interleaved 1F1B with m a multiple of p is Megatron's order: tandem's generator
// gives the same compute on every rank.
TEST(TorchCsvTest, TorchsInterleavedIsTandemsInterleaved) {
  auto from_torch = ReadTorchCsvSchedule(DataPath("interleaved1f1b_p4_m8.csv"));
  ASSERT_TRUE(from_torch.ok()) << from_torch.status();
  auto generated = GenerateInterleaved(4, 8, 2);
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(*FormatTorchCsvSchedule(*from_torch, TorchCsvForm::kComputeOnly),
            *FormatTorchCsvSchedule(*generated, TorchCsvForm::kComputeOnly));
}

TEST(TorchCsvTest, TandemsSchedulesRoundTripExactly) {
  std::vector<ScheduleSpec> specs;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1,
                            ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    specs.push_back({kind, 4, 8});
  }
  specs.push_back({ScheduleKind::kInterleaved, 4, 8, /*chunks=*/2});
  specs.push_back({ScheduleKind::kInterleaved, 3, 7, /*chunks=*/3});
  specs.push_back({ScheduleKind::kHanayo, 2, 6, 1, /*waves=*/2});
  specs.push_back({ScheduleKind::k1F1B, 1, 3});
  for (const ScheduleSpec& spec : specs) {
    SCOPED_TRACE(ToJson(spec).dump());
    auto generated = GenerateSchedule(spec);
    ASSERT_TRUE(generated.ok()) << generated.status();
    for (TorchCsvForm form : {TorchCsvForm::kComputeOnly, TorchCsvForm::kWithCommunication}) {
      auto text = FormatTorchCsvSchedule(*generated, form);
      ASSERT_TRUE(text.ok()) << text.status();
      auto read = ParseTorchCsvSchedule(*text, "generated.csv");
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->spec.kind, ScheduleKind::kCustom);
      EXPECT_EQ(read->placement, generated->placement);
      EXPECT_EQ(read->spec.NumStages(), generated->spec.NumStages());
      // Lowered, the programs are the generator's; compute only, tandem places the same
      // transfers again.
      EXPECT_EQ(read->programs, generated->programs);
      EXPECT_EQ(*FormatTorchCsvSchedule(*read, form), *text);
    }
  }
}

TEST(TorchCsvTest, TwoReplicasDoNotFitTorchsFormat) {
  auto chimera = GenerateChimera(4, 8);
  ASSERT_TRUE(chimera.ok());
  auto text = FormatTorchCsvSchedule(*chimera, TorchCsvForm::kComputeOnly);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(text.status().message(), "one pipeline")) << text.status();
}

TEST(TorchCsvTest, BadFilesFailWithOneLine) {
  struct Bad {
    const char* text;
    const char* error;
  };
  const Bad kBad[] = {
      {"", "no rows"},
      {"0F0,0X0,0B0\r\n", "rank 0, cell 2 ('0X0'): unknown action type 'X'"},
      {"0F0,F1\r\n", "expected a stage index"},
      {"0F0,0B\r\n", "B needs a micro-batch index"},
      {"0F0,0B0x\r\n", "trailing characters 'x'"},
      {"0F0,0B99999999\r\n", "micro-batch index below"},
      {"99999999F0\r\n", "stage index below"},
      {"0F0,\"0B0\"\r\n", "quoted cells"},
      {"(0F0;0B0\r\n", "'(' without ')'"},
      {"(0F0;0B0)OVERLAP\r\n", "unknown composite action"},
      {"(0F0;0SEND_F0)OVERLAP_F_B\r\n", "compute actions only"},
      {"0F0,1F0,1B0,0B0\r\n1F1\r\n", "stage 1 also runs on rank 0"},
      {"0F0,2F0,2B0,0B0\r\n", "stage 1 never runs"},
      {"0F0,3F0,3B0,0B0\r\n1F0,2F0,2B0,1B0\r\n4F0,4B0\r\n", "same number of stages"},
      {"0F0,1F0,1B0,0B0\r\n2F0,3F0,3B0,2B0\r\n", "neither looped"},
      {"0B0,0F0\r\n", "not a valid schedule"},
      {"0F0,0SEND_F0,0B0\r\n", "has no neighbour 1"},
      {"0F0,0SEND_F0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n", "not a valid schedule"},
      {"0F0,1RECV_F0\r\n1F0\r\n", "stage 1 does not run on rank 0"},
      {"0F0,0B0,0REDUCE_GRAD,0REDUCE_GRAD\r\n", "a second REDUCE_GRAD"},
  };
  for (const Bad& bad : kBad) {
    SCOPED_TRACE(bad.text);
    auto schedule = ParseTorchCsvSchedule(bad.text, "bad.csv");
    ASSERT_FALSE(schedule.ok());
    EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument) << schedule.status();
    const std::string message(schedule.status().message());
    EXPECT_TRUE(absl::StartsWith(message, "bad.csv")) << message;
    EXPECT_TRUE(absl::StrContains(message, bad.error)) << message;
    EXPECT_FALSE(absl::StrContains(message, "\n")) << message;
  }
}

// Truncations and single-byte changes of a real file: an error or a valid schedule, never a
// crash.
TEST(TorchCsvTest, DamagedFilesNeverCrash) {
  const std::string text = ReadData("zbv_p2_m4_comms.csv");
  ASSERT_FALSE(text.empty());
  int errors = 0;
  for (size_t cut = 0; cut < text.size(); cut += 7) {
    auto schedule = ParseTorchCsvSchedule(text.substr(0, cut), "cut.csv");
    if (!schedule.ok()) {
      ++errors;
    } else {
      EXPECT_TRUE(ValidateSchedule(*schedule).ok());
    }
  }
  for (size_t at = 0; at < text.size(); at += 5) {
    for (char c : {'0', '9', 'F', 'B', ',', '(', '\n', '\r', '\0', '\x7f'}) {
      std::string damaged = text;
      damaged[at] = c;
      auto schedule = ParseTorchCsvSchedule(damaged, "damaged.csv");
      if (schedule.ok()) {
        EXPECT_TRUE(ValidateSchedule(*schedule).ok());
        continue;
      }
      ++errors;
      EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument);
      const absl::string_view message = schedule.status().message();
      for (char m : message) {
        EXPECT_TRUE(m >= ' ' && m < 0x7f) << "unprintable byte in: " << message;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace tandem::pipeline
