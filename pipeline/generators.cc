#include "pipeline/generators.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "pipeline/internal/generator.h"

// The generators live one per file in pipeline/generators/; the list scheduler and the
// program completion they share, in pipeline/internal/.
namespace tandem::pipeline {
namespace {

// Checks ranges and the options that do not apply to `spec.kind`.
absl::Status CheckCommon(const ScheduleSpec& spec) {
  absl::string_view name = ScheduleKindName(spec.kind);
  TANDEM_RETURN_IF_ERROR(Annotate(CheckScheduleSpec(spec), name));
  const bool v_shaped = spec.kind == ScheduleKind::kZBV || spec.kind == ScheduleKind::kDualPipeV;
  bool uses_chunks = spec.kind == ScheduleKind::kInterleaved || spec.kind == ScheduleKind::kCustom;
  if (!uses_chunks && !v_shaped && spec.chunks != 1) {
    return internal::Invalid(
        name, absl::StrCat("chunks apply only to interleaved (got chunks=", spec.chunks, ")"));
  }
  if (v_shaped && spec.chunks != 1 && spec.chunks != 2) {
    return internal::Invalid(
        name, absl::StrCat(name, " always uses 2 chunks per rank (got chunks=", spec.chunks, ")"));
  }
  if (spec.kind != ScheduleKind::kHanayo && spec.waves != 1) {
    return internal::Invalid(
        name, absl::StrCat("waves apply only to hanayo (got waves=", spec.waves, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

// A spec of `kind`, checked by CheckCommon.
absl::StatusOr<ScheduleSpec> CheckedSpec(ScheduleKind kind, int num_ranks, int num_microbatches,
                                         int chunks, int waves) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = num_ranks;
  spec.num_microbatches = num_microbatches;
  spec.chunks = chunks;
  spec.waves = waves;
  TANDEM_RETURN_IF_ERROR(CheckCommon(spec));
  return spec;
}

ListScheduled OneFOneBPerRank(ScheduleSpec spec, Placement placement, std::vector<Unit> units,
                              const std::function<int(int)>& warmup, int chunk_stride,
                              int num_chunks) {
  ListScheduled kind;
  kind.spec = std::move(spec);
  kind.placement = std::move(placement);
  kind.config = ConfigFor(kind.spec, kind.placement);
  // The streams point into the units, so the streams' maker holds them.
  auto shared = std::make_shared<const std::vector<Unit>>(std::move(units));
  std::vector<int> warmups(kind.placement.num_ranks);
  for (int r = 0; r < kind.placement.num_ranks; ++r) warmups[r] = warmup(r);
  kind.make_streams = [shared, warmups, chunk_stride, num_chunks](const Placement&) {
    Streams streams(warmups.size());
    for (size_t r = 0; r < warmups.size(); ++r) {
      streams[r].push_back(Stream::OneFOneB(/*replica=*/0, /*stage=*/static_cast<int>(r),
                                            shared.get(), warmups[r], chunk_stride, num_chunks));
    }
    return streams;
  };
  return kind;
}

absl::StatusOr<std::optional<ListScheduled>> ListScheduledFor(const ScheduleSpec& spec) {
  TANDEM_RETURN_IF_ERROR(CheckCommon(spec));
  switch (spec.kind) {
    case ScheduleKind::kHanayo:
      return HanayoKind(spec.num_ranks, spec.num_microbatches, spec.waves);
    case ScheduleKind::kZBV:
      return ZBVKind(spec.num_ranks, spec.num_microbatches, spec.planning_costs);
    case ScheduleKind::kChimera:
      return ChimeraKind(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kInterleaved:
      return InterleavedKind(spec.num_ranks, spec.num_microbatches, spec.chunks);
    case ScheduleKind::kGPipe:
      return GPipeKind(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::k1F1B:
      return OneFOneBKind(spec.num_ranks, spec.num_microbatches);
    default:
      return std::nullopt;
  }
}

}  // namespace internal

absl::StatusOr<Schedule> GenerateSchedule(const ScheduleSpec& spec) {
  TANDEM_RETURN_IF_ERROR(CheckCommon(spec));
  switch (spec.kind) {
    case ScheduleKind::kGPipe:
      return GenerateGPipe(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::k1F1B:
      return Generate1F1B(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kInterleaved:
      return GenerateInterleaved(spec.num_ranks, spec.num_microbatches, spec.chunks);
    case ScheduleKind::kChimera:
      return GenerateChimera(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kHanayo:
      return GenerateHanayo(spec.num_ranks, spec.num_microbatches, spec.waves);
    case ScheduleKind::kZBH1:
      return GenerateZBH1(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kZBV:
      return GenerateZBV(spec.num_ranks, spec.num_microbatches, spec.planning_costs);
    case ScheduleKind::kDualPipe:
      return GenerateDualPipe(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kDualPipeV:
      return GenerateDualPipeV(spec.num_ranks, spec.num_microbatches);
    case ScheduleKind::kCustom:
      return absl::InvalidArgumentError(
          "custom: a custom schedule is read from its file (tandem schedule --from-csv; "
          "pipeline/torch_csv.h), not generated");
  }
  return absl::InvalidArgumentError("unknown schedule kind");
}

}  // namespace tandem::pipeline
