// The schedule IR: for every rank an ordered program of actions. One IR serves the generators
// (pipeline/generators.h), the validator (pipeline/validator.h), the simulator
// (pipeline/simulator.h) and the runtime, so what is simulated is what runs.
//
// Vocabulary
//   rank       a device / process executing one program.
//   stage      a position in one pipeline, 0 .. num_stages-1. With interleaving (v chunks per
//              rank) or Hanayo waves the pipeline has num_ranks * chunks stages ("virtual
//              stages"); each is a contiguous slice of the model.
//   replica    a pipeline replica: 0 normally; Chimera has two (0 runs stage 0 on rank 0
//              downwards, 1 runs stage 0 on rank D-1 upwards), each rank holding one stage of
//              each, i.e. two copies of weights whose gradients are summed.
//   microbatch global micro-batch index 0 .. num_microbatches-1 (Chimera splits them between
//              replicas; an action names both).
//
// Chimera's gradient summation: stage s has two copies, replica 0 on rank s and replica 1 on
// rank D-1-s. Each rank issues one GradientSync per (replica, stage) it holds; the runtime's
// synchronisation group for stage s spans the ranks of both copies (and the data-parallel
// replicas), so its all-reduce sums the two copies' gradients and both copies stay equal.
//
// Transfers name the stage whose output they carry: SendActivation(stage s) on the rank of s
// carries s's output to the rank of s+1 and is matched by RecvActivation(stage s) there;
// SendGradient(stage s) carries the gradient of s's input to the rank of s-1. When two
// neighbouring stages live on the same rank there is no transfer. Between a pair of ranks,
// transfers are matched in program order (FIFO per direction), as NCCL requires.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem {
class AtomicFileWriter;  // common/file_util.h
}  // namespace tandem

namespace tandem::pipeline {

enum class ActionType : uint8_t {
  kForward,         // F: forward of (stage, microbatch)
  kBackward,        // B: full backward (input and weight gradients)
  kBackwardInput,   // Bi: input-gradient half of a split backward (zero-bubble "B")
  kBackwardWeight,  // W: weight-gradient half of a split backward (zero-bubble "W")
  kSendActivation,
  kRecvActivation,
  kSendGradient,
  kRecvGradient,
  kGradientSync,    // start gradient synchronisation of `stage` (all micro-batches done)
  kOptimizerStep,   // wait for this rank's syncs and step the optimizer (stage = -1)
};

// Short names used in grids and JSON: "F", "B", "Bi", "W", "sA", "rA", "sG", "rG", "sync",
// "step".
absl::string_view ActionTypeName(ActionType type);
absl::StatusOr<ActionType> ParseActionType(absl::string_view name);
bool IsCompute(ActionType type);   // F, B, Bi, W
bool IsTransfer(ActionType type);  // sA, rA, sG, rG

// 8 bytes: programs at p=1024, m=4096 hold 50-100 million of them, written once and read by
// the validator, the simulator and the runtime. Built field by field or as
// Action{type, stage, microbatch, replica, peer}; the fields are narrow (stages and
// micro-batches below 2^15, kMaxStages and kMaxMicrobatches), and every reader of schedules
// checks the ranges before it builds one.
struct Action {
  constexpr Action() = default;
  constexpr Action(ActionType type, int stage, int microbatch, int replica = 0, int peer = -1)
      : type(type),
        replica(static_cast<uint8_t>(replica)),
        peer(static_cast<int16_t>(peer)),
        stage(static_cast<int16_t>(stage)),
        microbatch(static_cast<int16_t>(microbatch)) {}

  ActionType type = ActionType::kForward;
  uint8_t replica = 0;     // < kMaxReplicas
  int16_t peer = -1;       // transfers: the other rank (< kMaxRanks); -1 otherwise
  int16_t stage = 0;       // < kMaxStages; -1 for kOptimizerStep
  int16_t microbatch = 0;  // < kMaxMicrobatches; -1 for kGradientSync / kOptimizerStep

  bool operator==(const Action& o) const {
    return type == o.type && stage == o.stage && microbatch == o.microbatch &&
           replica == o.replica && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};
static_assert(sizeof(Action) == 8, "Action is packed into 8 bytes");

// "F3.1" (stage 3, micro-batch 1), "F3.1r1" for replica 1, "sA3.1>2" (send to rank 2),
// "rG2.0<3", "sync3", "sync3r1", "step".
std::string ToString(const Action& action);
// Appends ToString(action) to *out (for writers of 10^8 actions: no string per action).
void AppendAction(std::string* out, const Action& action);
// Inverse of ToString. Checks each field fits its range (stage < kMaxStages, ...), not the
// schedule it belongs to (the validator does). InvalidArgument names the text.
absl::StatusOr<Action> ParseAction(absl::string_view text);

// kCustom is a schedule given as explicit per-rank programs (read from a file, e.g. torch's CSV
// format: pipeline/torch_csv.h); it has no generator.
enum class ScheduleKind : uint8_t {
  kGPipe,
  k1F1B,
  kInterleaved,
  kChimera,
  kHanayo,
  kZBH1,
  kZBV,
  kDualPipe,
  kDualPipeV,
  kCustom,
};

// "gpipe", "1f1b", "interleaved", "chimera", "hanayo", "zb-h1", "zb-v", "dualpipe",
// "dualpipev", "custom".
absl::string_view ScheduleKindName(ScheduleKind kind);
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
// Names of all kinds, for help text and errors (the generated ones: not "custom").
std::string ScheduleKindList();

// Ranges every spec must respect (generators add their own constraints).
inline constexpr int kMaxRanks = 16384;
inline constexpr int kMaxReplicas = 256;  // pipeline replicas (Chimera: 2)
inline constexpr int kMaxMicrobatches = 1 << 15;  // Action::microbatch is 16 bits
// Stages of one pipeline (ranks x chunks per rank): Action::stage is 16 bits.
inline constexpr int kMaxStages = 1 << 15;
inline constexpr int kMaxChunks = 64;
inline constexpr int kMaxWaves = 64;
inline constexpr int kMaxPlanningCost = 1000;
// Upper bound on (replica, stage, micro-batch) triples of one schedule, so that a generated
// schedule fits in memory (about 6 actions of 8 bytes each per triple).
inline constexpr int64_t kMaxStageMicrobatches = int64_t{1} << 24;

// What a generator is asked for.
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int num_ranks = 1;         // p (Chimera: D)
  int num_microbatches = 1;  // m
  int chunks = 1;            // v, interleaved only (>= 1); ZB-V uses 2
  int waves = 1;             // W, Hanayo only; each rank holds 2W chunks
  // ZB-V only: the relative durations of a forward, an input-gradient and a weight-gradient
  // pass its list scheduler plans with, each in [1, kMaxPlanningCost]; all zero: equal (the
  // zero-bubble paper's assumption). Every rank must use the same (they are in the plan).
  std::array<int, 3> planning_costs{};
  // Custom only: the stages (chunks per rank) go on the ranks in waves, down the ranks and back
  // up (torch's "v" style: Placement::Wave(p, chunks / 2)), rather than looped
  // (Placement::Looped(p, chunks)).
  bool wave_placement = false;

  bool operator==(const ScheduleSpec& o) const {
    return kind == o.kind && num_ranks == o.num_ranks && num_microbatches == o.num_microbatches &&
           chunks == o.chunks && waves == o.waves && planning_costs == o.planning_costs &&
           wave_placement == o.wave_placement;
  }
  // Stages in one pipeline: p for GPipe/1F1B/ZB-H1/Chimera/DualPipe, p*v interleaved and
  // custom, 2*W*p Hanayo, 2*p ZB-V and DualPipeV.
  int NumStages() const;
  // Pipeline replicas: 2 for Chimera and DualPipe, else 1.
  int NumReplicas() const;
  // Whether backward may be split into input and weight halves (ZB-H1, ZB-V, DualPipe(V),
  // custom). Such a schedule runs every backward either as Bi and W or as one B (both halves
  // at once: DualPipe does so where it has nothing to fill).
  bool SplitsBackward() const;
  // Chunks (stages) each rank holds per replica: 1, v (interleaved, custom), 2W or 2.
  int ChunksPerRank() const;
};

// Range checks common to all kinds (p, m, v, W within the limits above, total size bounded).
// InvalidArgument names the field, e.g. "microbatches must be in [1, 32768], got 0".
absl::Status CheckScheduleSpec(const ScheduleSpec& spec);

// "F,Bi,W" (three positive numbers) as relative planning costs; InvalidArgument names the
// text otherwise.
absl::StatusOr<std::array<double, 3>> ParsePlanningCosts(absl::string_view text);
// Relative costs as ScheduleSpec::planning_costs: scaled so that the largest is 100 (each at
// least 1); all zero (or not positive) stays all zero.
std::array<int, 3> PlanningCostTicks(const std::array<double, 3>& costs);

// Maps (replica, stage) to the rank that runs it.
struct Placement {
  int num_ranks = 0;
  int num_stages = 0;
  // stage_to_rank[replica][stage]
  std::vector<std::vector<int>> stage_to_rank;

  int NumReplicas() const { return static_cast<int>(stage_to_rank.size()); }
  int RankOf(int replica, int stage) const { return stage_to_rank[replica][stage]; }
  // (replica, stage) pairs a rank holds, in stage order per replica.
  std::vector<std::pair<int, int>> StagesOf(int rank) const;
  bool operator==(const Placement& o) const {
    return num_ranks == o.num_ranks && num_stages == o.num_stages &&
           stage_to_rank == o.stage_to_rank;
  }

  // Stage s on rank s.
  static Placement Linear(int num_ranks);
  // Interleaved ("looped"): stage s on rank s % p, p*v stages.
  static Placement Looped(int num_ranks, int chunks);
  // Hanayo/ZB-V wave order: down the ranks, then back up, repeated for `waves` waves
  // (2*waves*p stages; stage s in wave-half h = s / p goes to rank (h even ? s%p : p-1-s%p)).
  static Placement Wave(int num_ranks, int waves);
  // Chimera: replica 0 linear, replica 1 reversed (stage s on rank p-1-s).
  static Placement Bidirectional(int num_ranks);
};

// A generated schedule: the spec, the placement and one program per rank.
struct Schedule {
  ScheduleSpec spec;
  Placement placement;
  std::vector<std::vector<Action>> programs;  // programs[rank]

  int NumRanks() const { return static_cast<int>(programs.size()); }
  int64_t NumActions() const;
  bool operator==(const Schedule& o) const {
    return spec == o.spec && placement == o.placement && programs == o.programs;
  }
};

// A 64-bit FNV-1a digest of the placement and of every action of every rank (type, stage,
// micro-batch, replica, peer) with rank boundaries: equal digests mean equal programs, for
// tests and benchmarks that check a generator's output did not change.
uint64_t ScheduleDigest(const Schedule& schedule);

// Readable per-rank grid: one line per rank, compute actions only by default
// ("rank 0 | F0.0 F0.1 B0.0 ..."); with `with_transfers` every action.
std::string FormatGrid(const Schedule& schedule, bool with_transfers = false);

struct GridOptions {
  bool with_transfers = false;
  int max_ranks = 0;    // 0 = all; otherwise the first ranks and a note for the rest
  int max_columns = 0;  // 0 = all; otherwise the first cells per rank and "... (+N)"
  // Cells each shown rank has beyond its program in the schedule given, counted in "... (+N)":
  // for a grid drawn from the first actions of each program (as `tandem schedule` keeps them
  // when it never holds the programs). Empty: none.
  std::vector<int64_t> cells_not_given;
};
std::string FormatGrid(const Schedule& schedule, const GridOptions& options);

// JSON round-trip. FromJson validates shape and ranges (not semantics: see the validator) and
// names the offending field.
nlohmann::json ToJson(const ScheduleSpec& spec);
absl::StatusOr<ScheduleSpec> ScheduleSpecFromJson(const nlohmann::json& j,
                                                  absl::string_view where = "schedule");
nlohmann::json ToJson(const Placement& placement);
absl::StatusOr<Placement> PlacementFromJson(const nlohmann::json& j,
                                            absl::string_view where = "placement");
nlohmann::json ToJson(const Schedule& schedule);
// Appends ToJson(schedule).dump() to `file`, byte for byte, as it is formatted: a schedule of
// 10^8 actions is most of a gigabyte of JSON, and tens of gigabytes as an nlohmann::json.
void WriteScheduleJson(const Schedule& schedule, AtomicFileWriter& file);
absl::StatusOr<Schedule> ScheduleFromJson(const nlohmann::json& j,
                                          absl::string_view where = "schedule");

}  // namespace tandem::pipeline
