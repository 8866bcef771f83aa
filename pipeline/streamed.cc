#include "pipeline/streamed.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"
#include "pipeline/internal/list_scheduler.h"
#include "pipeline/internal/emitted_actions.h"
#include "pipeline/validator.h"
#include "pipeline/validator_internal.h"

namespace tandem::pipeline {
namespace {

// Reads each batch of emitted actions with the proof (grouped rendezvous: the stricter mode,
// whose per-rank checks are those of both) and the simulator, and keeps the start of the first
// ranks' programs for a grid. The last batch finishes both.
class Readers : public internal::ActionConsumer {
 public:
  Readers(internal::StreamedProof& proof, ScheduleSimulator& simulator,
          const StreamOptions& options, StreamedSchedule& out)
      : proof_(proof),
        simulator_(simulator),
        options_(options),
        out_(out),
        kept_ranks_(std::min(options.kept_ranks, out.kept.NumRanks())) {
    out_.cells_not_kept.assign(kept_ranks_, 0);
  }

  void Consume(const internal::EmittedActions& batch) override {
    out_.num_actions += static_cast<int64_t>(batch.size);
    if (kept_ranks_ > 0) Keep(batch);
    if (ok_) ok_ = proof_.Take(batch) && simulator_.Take(batch).ok();
    if (!batch.last || !ok_) return;
    ok_ = proof_.ChecksPassed();
    if (!ok_) return;
    absl::StatusOr<SimulationResult> simulated = simulator_.Finish();
    ok_ = simulated.ok();
    if (!ok_) return;
    out_.simulation = *std::move(simulated);
    out_.valid_grouped_rendezvous = proof_.Finished();
  }

  // Every check passed and the simulation finished (after the last batch).
  bool ok() const { return ok_; }

 private:
  // The start of the first ranks' programs, for a grid; the rest counted.
  void Keep(const internal::EmittedActions& batch) {
    for (size_t j = 0; j < batch.size; ++j) {
      const int r = batch.ranks[j];
      const Action& a = batch.actions[j];
      if (r >= kept_ranks_ || (!options_.kept_transfers && !IsCompute(a.type))) continue;
      std::vector<Action>& start = out_.kept.programs[r];
      if (static_cast<int>(start.size()) < options_.kept_cells) {
        start.push_back(a);
      } else {
        ++out_.cells_not_kept[r];
      }
    }
  }

  internal::StreamedProof& proof_;
  ScheduleSimulator& simulator_;
  const StreamOptions& options_;
  StreamedSchedule& out_;
  const int kept_ranks_;
  bool ok_ = true;
};

}  // namespace

absl::StatusOr<std::optional<StreamedSchedule>> GenerateAndSimulateStreamed(
    const ScheduleSpec& spec,
    const std::function<absl::StatusOr<CostModel>(const ScheduleSpec&)>& costs_for,
    const StreamOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<internal::ListScheduled> kind,
                          internal::ListScheduledFor(spec));
  if (!kind) return std::nullopt;
  TANDEM_ASSIGN_OR_RETURN(const CostModel costs, costs_for(kind->spec));
  // The schedule's shape: what the proof and the simulator know before any action.
  Schedule shape;
  shape.spec = kind->spec;
  shape.placement = kind->placement;
  shape.programs.resize(kind->placement.num_ranks);
  ValidationOptions grouped;
  grouped.grouped_rendezvous = true;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<internal::StreamedProof> proof,
                          internal::StreamedProof::Create(shape, grouped));
  TANDEM_ASSIGN_OR_RETURN(ScheduleSimulator simulator, ScheduleSimulator::Create(shape));
  TANDEM_RETURN_IF_ERROR(simulator.Start(costs));
  StreamedSchedule out;
  out.spec = kind->spec;
  out.kept = shape;
  Readers readers(*proof, simulator, options, out);
  const absl::Status generated = internal::ScheduleAndStream(
      *kind, readers, static_cast<size_t>(std::max<int64_t>(1, options.batch_actions)));
  if (absl::IsAborted(generated)) return std::nullopt;
  TANDEM_RETURN_IF_ERROR(generated);
  if (!readers.ok()) return std::nullopt;
  return out;
}

}  // namespace tandem::pipeline
