#include "pipeline/streamed.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/internal/generator.h"
#include "pipeline/internal/list_scheduler.h"
#include "pipeline/internal/program_chunks.h"
#include "pipeline/validator.h"
#include "pipeline/validator_internal.h"

namespace tandem::pipeline {
namespace {

// Reads each hand-over with the proof (grouped rendezvous: the stricter mode, whose per-rank
// checks are those of both) and the simulator, then drops what both have passed. The last
// hand-over (complete) finishes both, while its chunks still exist.
class Readers : public internal::ProgramConsumer {
 public:
  Readers(internal::StreamedProof& proof, ScheduleSimulator& simulator,
          const StreamOptions& options, StreamedSchedule& out)
      : proof_(proof),
        simulator_(simulator),
        options_(options),
        out_(out),
        seen_(std::min(options.kept_ranks, out.kept.NumRanks()), 0) {
    out_.cells_not_kept.assign(seen_.size(), 0);
  }

  void Consume(internal::ProgramChunks& chunks) override {
    const int num_ranks = chunks.num_ranks();
    Keep(chunks);
    if (ok_) ok_ = proof_.Continue(chunks) && simulator_.Continue(chunks).ok();
    if (chunks.Complete()) {
      for (int r = 0; r < num_ranks; ++r) out_.num_actions += chunks.Available(r);
      ok_ = ok_ && proof_.ChecksPassed();
      if (!ok_) return;
      absl::StatusOr<SimulationResult> simulated = simulator_.Finish(chunks);
      ok_ = simulated.ok();
      if (!ok_) return;
      out_.simulation = *std::move(simulated);
      out_.valid_grouped_rendezvous = proof_.Finished(chunks);
      return;
    }
    for (int r = 0; r < num_ranks; ++r) {
      chunks.Trim(r, ok_ ? std::min(proof_.Needed(r), simulator_.Needed(r))
                         : chunks.Available(r));
    }
  }

  // Every check passed and the simulation finished (after the complete hand-over).
  bool ok() const { return ok_; }

 private:
  // The start of the first ranks' programs, for a grid; the rest counted.
  void Keep(const internal::ProgramChunks& chunks) {
    for (int r = 0; r < static_cast<int>(seen_.size()); ++r) {
      const Action* program = chunks.Begin(r);
      for (int64_t k = seen_[r]; k < chunks.Available(r); ++k) {
        const Action& a = program[k - chunks.First(r)];
        if (!options_.kept_transfers && !IsCompute(a.type)) continue;
        std::vector<Action>& start = out_.kept.programs[r];
        if (static_cast<int>(start.size()) < options_.kept_cells) {
          start.push_back(a);
        } else {
          ++out_.cells_not_kept[r];
        }
      }
      seen_[r] = chunks.Available(r);
    }
  }

  internal::StreamedProof& proof_;
  ScheduleSimulator& simulator_;
  const StreamOptions& options_;
  StreamedSchedule& out_;
  std::vector<int64_t> seen_;  // per kept rank: the first step not looked at
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
      *kind, readers, static_cast<size_t>(std::max<int64_t>(1, options.round_computes)));
  if (absl::IsAborted(generated)) return std::nullopt;
  TANDEM_RETURN_IF_ERROR(generated);
  if (!readers.ok()) return std::nullopt;
  return out;
}

}  // namespace tandem::pipeline
