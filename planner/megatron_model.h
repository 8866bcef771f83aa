// Megatron-LM's PTD-P training (Narayanan et al., "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", SC'21) of GPT models on A100 clusters, as a
// cost model timed with tandem's pipeline simulator. Used to reproduce the paper's weak-scaling
// table (bench/planner/megatron_table_bench.cc) and to let a search pick other configurations
// under the same costs.
//
// Per transformer layer, micro-batch b, sequence s, hidden h, a heads, tensor-parallel degree t:
//   GEMMs          (24 b s h^2 + 4 b s^2 h) / t FLOPs forward, twice that backward, run at
//                  `gemm_efficiency` of the peak;
//   other kernels  layer norms, softmax, GeLU, dropout, residuals: memory-bound, moving
//                  `elementwise_traffic` times the layer's activation bytes
//                  s b h (10 + 24/t + 5 a s / (h t)) (Korthikanti et al. 2022; without
//                  sequence parallelism layer norms and dropouts are replicated over t) through
//                  HBM forward, twice that backward;
//   tensor parallel ring all-reduces of 2 s b h bytes over NVLink: 2 forward, 2 backward and,
//                  with recomputation, 2 in the recomputed forward, all on the critical path;
//   recomputation  the backward re-runs the forward (compute and its all-reduces).
// The first stage adds the embedding (one all-reduce forward), the last the logits
// (2 b s h V / t forward, twice that backward, 6 s b V / t bytes of logits and softmax).
// Pipeline transfers use the scatter/gather optimisation: each of the t GPUs sends 2 s b h / t
// bytes over its own InfiniBand adapter, then an all-gather over NVLink. The interleaved 1F1B
// schedule is generated and simulated (pipeline/simulator.h) for one pipeline; every pipeline
// is the same. After the last backward, not overlapped (as Megatron-LM did in 2021): the
// data-parallel ring all-reduce of the fp16 gradients, the all-reduce of the tied embedding's
// gradient between the first and last stage, and the optimizer step (memory-bound, 32 bytes of
// HBM traffic per parameter). Ranks are ordered as Megatron-LM orders them: tensor-parallel
// innermost, then data-parallel, then pipeline, so a data-parallel group has 8 / t GPUs in a
// node (at least one) and pipeline neighbours sit in different nodes once t d >= 8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/profile.h"
#include "pipeline/schedule.h"

namespace tandem::planner {

struct MegatronGpt {
  int layers = 128;
  int hidden = 25600;
  int heads = 160;
  int sequence = 2048;
  int vocabulary = 51200;
  // Parameters by the paper's eq. 2: 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)).
  double Parameters() const;
};

struct MegatronConfig {
  int tensor_parallel = 8;
  int pipeline_parallel = 64;
  int data_parallel = 6;
  int64_t global_batch = 3072;
  int microbatch_size = 1;
  int interleave_chunks = 1;  // v model chunks per pipeline rank (1 = plain 1F1B)
  bool recompute = true;      // full activation recomputation
  int Gpus() const { return tensor_parallel * pipeline_parallel * data_parallel; }
};

// The cluster and the two fitted constants. Everything but the constants marked "fitted" is a
// published device or network figure.
struct A100Cluster {
  double peak_flops = 312e12;               // bf16 / fp16 dense
  double hbm_bytes_per_second = 2.039e12;   // A100 80GB SXM
  double memory_bytes = 80e9;
  int gpus_per_node = 8;
  double nvlink_bytes_per_second = 300e9;   // NVSwitch, per GPU per direction
  double infiniband_bytes_per_second_per_gpu = 25e9;  // 8 x 200 Gb/s HDR per node
  double latency_seconds = 5e-6;            // per message (NVLink or InfiniBand)
  // Fitted to the table (bench/planner/megatron_table_bench.cc --fit).
  double gemm_efficiency = 0.0;     // fraction of peak reached by the GEMMs
  double elementwise_traffic = 0.0; // HBM traffic of the other kernels / activation bytes
};

// The fitted A100 cluster (constants documented in docs/planner.md).
A100Cluster SeleneA100();

// FLOPs of one iteration with full recomputation, the paper's eq. 3:
// 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)).
double MegatronIterationFlops(const MegatronGpt& model, int64_t global_batch);

struct MegatronPrediction {
  double iteration_seconds = 0;
  double tflops_per_gpu = 0;        // eq. 3 FLOPs / (GPUs * iteration time) / 1e12
  double pipeline_seconds = 0;      // simulated makespan of the forward/backward passes
  double data_parallel_seconds = 0; // gradient all-reduce (data-parallel + embedding)
  double optimizer_seconds = 0;
  double bubble_ratio = 0;          // simulator's idle fraction of the pipeline
  double layer_forward_seconds = 0; // one transformer layer, one micro-batch, with its TP
  double tensor_parallel_seconds = 0;  // all-reduces per layer per micro-batch (fw + bw)
  double memory_bytes = 0;          // peak per GPU estimate (first pipeline stage)
  int microbatches = 0;             // per pipeline
  pipeline::ScheduleSpec schedule;
  int64_t simulated_actions = 0;
};

// InvalidArgument when the configuration does not divide (GPUs, batch, layers per chunk,
// tensor-parallel groups larger than a node).
absl::StatusOr<MegatronPrediction> PredictMegatron(const MegatronGpt& model,
                                                   const MegatronConfig& config,
                                                   const A100Cluster& cluster);

// One row of the paper's Table 1 (weak scaling on Selene, V = 51,200, s = 2048), with the
// configuration Megatron-LM ran: t, p, GPUs and batch as published; micro-batch size 1 and the
// interleaving degree (not published) chosen as the smallest v > 1 dividing the layers per
// pipeline rank (1 without pipelining).
struct MegatronTableRow {
  double parameters_billions = 0;  // as published
  MegatronGpt model;
  MegatronConfig config;
  double published_tflops_per_gpu = 0;
  double published_percent_of_peak = 0;
  double published_aggregate_pflops = 0;
};
std::vector<MegatronTableRow> MegatronTable1();

// Peak memory per GPU (first pipeline rank): model state (16 bytes per parameter), the stashed
// activations of the micro-batch chunks in flight (interleaved warm-up: 2 (p - 1) + (v - 1) p
// + 1 chunks; 1F1B: p micro-batches; the layer inputs only with recomputation), and one layer's
// full activations.
double MegatronMemoryBytes(const MegatronGpt& model, const MegatronConfig& config);

// The same costs as a tandem profile (pipeline/profile.h) at one micro-batch size, so that the
// planner's own algorithms (AdaPipe with the schedule search) can plan the model: an embedding
// layer, the transformer layers, the logits, with tensor-parallel variants of degree 2, 4 and 8
// whose communication is the all-reduces above (the recomputed forward adds half of it, as
// ProfileAtTensorParallel counts). The embedding holds the tied weights.
pipeline::Profile MegatronProfile(const MegatronGpt& model, int microbatch_size,
                                  const A100Cluster& cluster);

// The configuration tandem picks under the same cost model: exhaustive over t in {1, 2, 4, 8}
// (inside a node), p dividing the layers, d = GPUs / (t p) dividing the batch, micro-batch size
// in {1, 2, 4, 8}, 1F1B or interleaved with v in {2, 3, 4} chunks (dividing the layers per
// rank), full or no recomputation; candidates over the cluster's memory are dropped before
// simulation, the rest are simulated and the highest throughput wins. ResourceExhausted when
// nothing fits.
struct MegatronSearchResult {
  MegatronConfig config;
  MegatronPrediction prediction;
  int candidates = 0;  // configurations that divide
  int simulated = 0;   // of them, those that fit the memory
};
absl::StatusOr<MegatronSearchResult> SearchMegatronConfig(const MegatronGpt& model, int gpus,
                                                          int64_t global_batch,
                                                          const A100Cluster& cluster);

}  // namespace tandem::planner
