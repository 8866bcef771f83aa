#include "pipeline/generators.h"

#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipeline/validator.h"

namespace tandem::pipeline {
namespace {

ScheduleSpec Spec(ScheduleKind kind, int p, int m, int chunks = 1, int waves = 1) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = p;
  spec.num_microbatches = m;
  spec.chunks = chunks;
  spec.waves = waves;
  return spec;
}

// Compute actions of a rank, as a compact string ("F0.0 F0.1 B0.0 ...").
std::string ComputeString(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.programs[rank]) {
    if (!IsCompute(a.type)) continue;
    if (!out.empty()) out += " ";
    out += ToString(a);
  }
  return out;
}

void ExpectValid(const ScheduleSpec& spec) {
  SCOPED_TRACE(absl::StrCat(ScheduleKindName(spec.kind), " p=", spec.num_ranks,
                            " m=", spec.num_microbatches, " v=", spec.chunks,
                            " W=", spec.waves));
  auto schedule = GenerateSchedule(spec);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(schedule->placement.num_stages, schedule->spec.NumStages());
  absl::Status plain = ValidateSchedule(*schedule);
  EXPECT_TRUE(plain.ok()) << plain;
  ValidationOptions strict;
  strict.grouped_rendezvous = true;
  absl::Status grouped = ValidateSchedule(*schedule, strict);
  EXPECT_TRUE(grouped.ok()) << grouped;
}

TEST(GeneratorsTest, EveryGeneratorPassesTheValidatorOverAGrid) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
      ExpectValid(Spec(ScheduleKind::kGPipe, p, m));
      ExpectValid(Spec(ScheduleKind::k1F1B, p, m));
      ExpectValid(Spec(ScheduleKind::kZBH1, p, m));
      ExpectValid(Spec(ScheduleKind::kZBV, p, m));
      for (int v : {1, 2, 3, 4}) ExpectValid(Spec(ScheduleKind::kInterleaved, p, m, v));
      for (int w : {1, 2, 3}) ExpectValid(Spec(ScheduleKind::kHanayo, p, m, 1, w));
      if (p % 2 == 0 && m % p == 0) ExpectValid(Spec(ScheduleKind::kChimera, p, m));
    }
  }
}

}  // namespace
}  // namespace tandem::pipeline
