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
// checks are those of both) and the simulator, then drops what both have passed.
class Readers : public internal::ProgramConsumer {
 public:
  Readers(internal::StreamedProof& proof, ScheduleSimulator& simulator,
          const StreamOptions& options, Schedule& kept, std::vector<int64_t>& not_kept)
      : proof_(proof),
        simulator_(simulator),
        options_(options),
        kept_(kept),
        not_kept_(not_kept),
        seen_(std::min(options.kept_ranks, kept.NumRanks()), 0) {
    not_kept_.assign(seen_.size(), 0);
  }

  void Consume(internal::ProgramChunks& chunks) override {
    const int num_ranks = chunks.num_ranks();
    Keep(chunks);
    if (chunks.Complete()) {
      for (int r = 0; r < num_ranks; ++r) num_actions_ += chunks.Available(r);
    }
    if (ok_) ok_ = proof_.Continue(chunks);
    if (ok_) {
      status_ = simulator_.Continue(chunks);
      ok_ = status_.ok();
    }
    if (chunks.Complete()) return;  // kept for Finish
    for (int r = 0; r < num_ranks; ++r) {
      chunks.Trim(r, ok_ ? std::min(proof_.Needed(r), simulator_.Needed(r))
                         : chunks.Available(r));
    }
  }

  bool ok() const { return ok_; }
  int64_t num_actions() const { return num_actions_; }

 private:
  // The start of the first ranks' programs, for a grid; the rest counted.
  void Keep(const internal::ProgramChunks& chunks) {
    for (int r = 0; r < static_cast<int>(seen_.size()); ++r) {
      const Action* program = chunks.Begin(r);
      for (int64_t k = seen_[r]; k < chunks.Available(r); ++k) {
        const Action& a = program[k - chunks.First(r)];
        if (!options_.kept_transfers && !IsCompute(a.type)) continue;
        std::vector<Action>& start = kept_.programs[r];
        if (static_cast<int>(start.size()) < options_.kept_cells) {
          start.push_back(a);
        } else {
          ++not_kept_[r];
        }
      }
      seen_[r] = chunks.Available(r);
    }
  }

  internal::StreamedProof& proof_;
  ScheduleSimulator& simulator_;
  const StreamOptions& options_;
  Schedule& kept_;
  std::vector<int64_t>& not_kept_;
  std::vector<int64_t> seen_;  // per kept rank: the first step not looked at
  bool ok_ = true;
  absl::Status status_;
  int64_t num_actions_ = 0;
};

// Hands the chunks to `readers` and keeps them for the simulator's Finish: ChunkWriter owns
// them, so the last hand-over leaves a pointer here.
class KeepLast : public internal::ProgramConsumer {
 public:
  explicit KeepLast(Readers& readers) : readers_(readers) {}
  void Consume(internal::ProgramChunks& chunks) override {
    readers_.Consume(chunks);
    if (chunks.Complete()) last_ = std::move(chunks);
  }
  std::optional<internal::ProgramChunks>& last() { return last_; }

 private:
  Readers& readers_;
  std::optional<internal::ProgramChunks> last_;
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
  out.kept = shape;
  Readers readers(*proof, simulator, options, out.kept, out.cells_not_kept);
  KeepLast keep(readers);
  const absl::Status generated = internal::ScheduleAndStream(
      *kind, keep, static_cast<size_t>(std::max<int64_t>(1, options.round_computes)));
  if (absl::IsAborted(generated)) return std::nullopt;
  TANDEM_RETURN_IF_ERROR(generated);
  if (!readers.ok() || !keep.last() || !proof->ChecksPassed()) return std::nullopt;
  const internal::ProgramChunks& chunks = *keep.last();
  absl::StatusOr<SimulationResult> simulated = simulator.Finish(chunks);
  if (!simulated.ok()) return std::nullopt;
  out.spec = kind->spec;
  out.num_actions = readers.num_actions();
  out.valid_grouped_rendezvous = proof->Finished(chunks);
  out.simulation = *std::move(simulated);
  return out;
}

}  // namespace tandem::pipeline
