// PipeDream's partitioner (Narayanan et al., SOSP 2019; optimizer_graph_hierarchical.py): the
// dynamic program over contiguous stages with per-stage data-parallel replication.
//
// Cost model, per network level with m machines and bandwidth B:
//   a stage of layers with compute time C (forward + backward) and parameter bytes P on r
//   replicas takes  (C + 4 (r-1) P / (B r) / w) / r  per sample ("time per stage"), where
//   4 (r-1) P / (B r) is PipeDream's all-reduce (parameter-server) term and w the number of
//   devices inside one machine of this level (1 at the innermost level: the machines of an
//   outer level are groups of inner ones that exchange their shares in parallel);
//   the pipeline's time is its slowest stage's. At an outer level the "compute time" of a
//   range of layers is the best time per stage the inner level found for it on one machine.
// Options as PipeDream's flags:
//   straight             no replication: exactly one machine per stage.
//   use_memory_constraint  a stage's stash (activations + parameters + optimizer state) times
//                        ceil((machines after its prefix) / r) must fit `memory_bytes`
//                        (PipeDream's estimate).
//   use_fewer_machines   the pipeline may leave machines unused (otherwise every machine of
//                        every level is used, as PipeDream's default).
//   activation_compression_ratio  > 0 also bounds each stage by its activation transfers
//                        2 * bytes / (B r) / ratio, in and out (PipeDream ignores activation
//                        transfers unless this flag is given; 0 = ignore).
// Heterogeneous clusters: a straight single-level pipeline uses each device's speed (stage i
// on device i); replicated plans assume every device runs at the slowest speed (synchronous
// replicas wait for the slowest).
//
// One difference from PipeDream's script: at an outer level it divides the all-reduce term by
// w only for the unsplit case; here both cases divide (single-level results are identical).
//
// DAG models: with `graph` given, stages are not contiguous ranges of the chain's order but
// differences of PipeDream's antichain states, enumerated as its optimizer does (from the first
// source, each state the down-set of an antichain; a state's successors advance one node of
// its augmented antichain, the antichain plus the earlier nodes whose outputs are still
// needed, to one of its consumers, taking along that consumer's other ancestors; a stage is
// the difference of a state and one of its ancestors in that DAG). The bottleneck is then
// PipeDream's on every profile it publishes, and `layer_order` gives an order of the layers in
// which every stage is contiguous.
//
// Complexity (L positions, N machines): O(L^2 N^2) per level with all machines used; with use_fewer_machines and no
// memory constraint the replica split is found at the crossing of the earlier stages' time
// (rising as the new stage takes more of the machines) and the new stage's (falling), which
// only moves one way as N grows: O(L^2 N).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "planner/layer_chain.h"

namespace tandem::planner {

struct PipeDreamLevel {
  int machines = 1;  // machines at this level (devices at level 0; nodes at level 1)
  double bandwidth_bytes_per_second = 0;
};

// A model's DAG as PipeDream's optimizer sees it (planner/importers.h fills it from graph.txt).
struct PipeDreamGraph {
  // Per layer of the chain, the layers whose outputs it consumes; empty for a source.
  std::vector<std::vector<int>> inputs;
  // Layers outside the state space (PipeDream drops input tensors' nodes); they carry no work
  // and go to the first stage.
  std::vector<bool> ignored;
  // Where the state space starts: the first source of the file that is not ignored.
  int start_layer = 0;
};

struct PipeDreamOptions {
  std::vector<PipeDreamLevel> levels;  // innermost first; devices = product of machines
  bool straight = false;
  bool use_memory_constraint = false;
  double memory_bytes = 0;
  bool use_fewer_machines = false;
  double activation_compression_ratio = 0;
  std::vector<double> device_speeds;  // empty = all 1; else one per device (level-0 order)
  // Optional: plan over PipeDream's antichain states of this DAG (one entry per layer)
  // instead of contiguous ranges of the chain's order.
  PipeDreamGraph graph;
  // Refuse graphs with more antichain states than this (ResourceExhausted, recognised by
  // IsTooManyStates). PipeDream's own profiles have at most a few thousand; inception_v3 has
  // 221,564, beyond what the tables below allow.
  int max_states = 20000;
  // Refuse searches beyond these estimates (ResourceExhausted naming them): the dynamic
  // program weighs about positions^2/2 x machines (split, machines) pairs per level, each
  // trying every replica count (the default: an update per count, about 5 ns on one core),
  // one (straight: counted as 4 updates, about 20 ns) or the crossing of the fast search
  // (use_fewer_machines: counted as 8), and keeps tables of positions x machines entries
  // (positions^2 x machines for outer levels). The default admits about 10 s of search.
  double max_cell_updates = 2e9;
  double max_table_bytes = 4.0 * (int64_t{1} << 30);
};

struct PipeDreamStage {
  int first_layer = 0;  // [first_layer, end_layer) of `layer_order` (of the chain if empty)
  int end_layer = 0;
  int replicas = 1;     // devices running copies of this stage (all levels)
  double seconds = 0;   // time per stage (per sample) at the innermost level
};

struct PipeDreamResult {
  double bottleneck_seconds = 0;      // PipeDream's "time per stage in pipeline"
  double single_machine_seconds = 0;  // sum of compute times
  double data_parallel_seconds = 0;   // PipeDream's data-parallel estimate on all devices
  int devices_used = 0;
  std::vector<PipeDreamStage> stages;
  // With a graph: the chain's layers in an order that keeps every stage contiguous (empty when
  // that is the chain's own order).
  std::vector<int> layer_order;
  int num_states = 0;  // positions the search split at (antichain states, or layers)
  // Updates the dynamic program made, weighted as max_cell_updates counts them: at most the
  // estimate that was checked against that limit.
  double table_updates = 0;
};

// InvalidArgument for bad options; ResourceExhausted when no partition satisfies the memory
// constraint.
absl::StatusOr<PipeDreamResult> RunPipeDream(const LayerChain& chain,
                                             const PipeDreamOptions& options);

// Whether `status` is RunPipeDream's refusal of a graph with more than options.max_states
// antichain states (raising the limit may let the search run).
bool IsTooManyStates(const absl::Status& status);

}  // namespace tandem::planner
