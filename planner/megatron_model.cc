#include "planner/megatron_model.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "pipeline/generators.h"
#include "pipeline/profile.h"
#include "pipeline/simulator.h"

namespace tandem::planner {
namespace {

constexpr double kBytesPerValue = 2.0;               // fp16 / bf16 activations and gradients
constexpr double kStateBytesPerParameter = 16.0;     // fp16 weight + grad, fp32 master + Adam
constexpr double kOptimizerTrafficPerParameter = 32.0;  // HBM bytes moved by the Adam step
constexpr double kLogitBytesPerValue = 6.0;          // fp16 logits + fp32 softmax
constexpr int kAllReducesPerPass = 2;                // after attention and after the MLP

// Ring all-reduce of `bytes` over `group` GPUs with `bandwidth` per GPU and direction.
double RingAllReduceSeconds(double bytes, int group, double bandwidth, double latency) {
  if (group <= 1) return 0;
  return 2.0 * (group - 1) / group * bytes / bandwidth + 2.0 * (group - 1) * latency;
}

// One transformer layer (and the logits) at tensor-parallel degree t, micro-batch b.
struct LayerCosts {
  double compute = 0;            // one pass without communication (backward: twice)
  double all_reduce = 0;         // one tensor-parallel all-reduce of the layer output
  double activation_bytes = 0;   // stashed per micro-batch without recomputation
  double head_compute = 0;       // logits, one pass
};

LayerCosts CostsAt(const MegatronGpt& model, int t, double b, const A100Cluster& cluster) {
  const double s = model.sequence, h = model.hidden, a = model.heads, vocab = model.vocabulary;
  const double sbh = s * b * h;
  const double effective_flops = cluster.peak_flops * cluster.gemm_efficiency;
  LayerCosts costs;
  costs.all_reduce = RingAllReduceSeconds(kBytesPerValue * sbh, t,
                                          cluster.nvlink_bytes_per_second,
                                          cluster.latency_seconds);
  costs.activation_bytes = sbh * (10 + 24.0 / t + 5 * a * s / (h * t));
  costs.compute = (24 * b * s * h * h + 4 * b * s * s * h) / t / effective_flops +
                  cluster.elementwise_traffic * costs.activation_bytes /
                      cluster.hbm_bytes_per_second;
  costs.head_compute = 2 * b * s * h * vocab / t / effective_flops +
                       cluster.elementwise_traffic * kLogitBytesPerValue * s * b * vocab / t /
                           cluster.hbm_bytes_per_second;
  return costs;
}

}  // namespace

pipeline::Profile MegatronProfile(const MegatronGpt& model, int microbatch_size,
                                  const A100Cluster& cluster) {
  const double b = microbatch_size, s = model.sequence, h = model.hidden,
               vocab = model.vocabulary;
  const double boundary_bytes = kBytesPerValue * s * b * h;
  pipeline::Profile profile;
  profile.model = absl::StrCat("gpt L=", model.layers, " h=", model.hidden, " a=", model.heads,
                               " s=", model.sequence);
  profile.microbatch_size = microbatch_size;
  profile.device = "A100-80GB (Megatron-LM cost model)";
  auto make_layer = [&](const std::string& name, double parameters, bool transformer) {
    pipeline::LayerProfile layer;
    layer.name = name;
    const LayerCosts one = CostsAt(model, 1, b, cluster);
    layer.forward_seconds = transformer ? one.compute : (name == "head" ? one.head_compute : 0);
    layer.backward_seconds = 2 * layer.forward_seconds;
    layer.output_activation_bytes = boundary_bytes;
    layer.stashed_activation_bytes =
        transformer ? one.activation_bytes
                    : (name == "head" ? kLogitBytesPerValue * s * b * vocab : boundary_bytes);
    layer.recompute_seconds = transformer ? layer.forward_seconds : 0;
    layer.recompute_stashed_bytes =
        transformer ? boundary_bytes : layer.stashed_activation_bytes;
    layer.parameter_bytes = kBytesPerValue * parameters;
    layer.optimizer_state_bytes = (kStateBytesPerParameter - 2 * kBytesPerValue) * parameters;
    for (int t : {2, 4, 8}) {
      if (t > cluster.gpus_per_node) continue;
      const LayerCosts at_t = CostsAt(model, t, b, cluster);
      pipeline::TensorParallelVariant variant;
      variant.degree = t;
      if (transformer) {
        variant.forward_seconds = at_t.compute;
        variant.stashed_activation_bytes = at_t.activation_bytes;
        variant.communication_seconds = 2 * kAllReducesPerPass * at_t.all_reduce;
      } else if (name == "head") {
        variant.forward_seconds = at_t.head_compute;
        variant.stashed_activation_bytes = layer.stashed_activation_bytes / t;
      } else {  // embedding: one all-reduce of its output
        variant.stashed_activation_bytes = boundary_bytes;
        variant.communication_seconds = at_t.all_reduce;
      }
      variant.backward_seconds = 2 * variant.forward_seconds;
      variant.parameter_bytes = layer.parameter_bytes / t;
      layer.tensor_parallel.push_back(variant);
    }
    return layer;
  };
  profile.layers.push_back(make_layer("embedding", (vocab + s) * h, false));
  for (int i = 0; i < model.layers; ++i) {
    profile.layers.push_back(make_layer(absl::StrCat("layer", i), 12 * h * h + 13 * h, true));
  }
  profile.layers.push_back(make_layer("head", 2 * h, false));  // tied weights: layer norm only
  return profile;
}

double MegatronGpt::Parameters() const {
  const double l = layers, h = hidden, v = vocabulary, s = sequence;
  return 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h));
}

A100Cluster SeleneA100() {
  A100Cluster cluster;
  cluster.gemm_efficiency = 0.66;
  cluster.elementwise_traffic = 2.0;
  return cluster;
}

double MegatronIterationFlops(const MegatronGpt& model, int64_t global_batch) {
  const double b = global_batch, s = model.sequence, l = model.layers, h = model.hidden,
               v = model.vocabulary;
  return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
}

absl::StatusOr<MegatronPrediction> PredictMegatron(const MegatronGpt& model,
                                                   const MegatronConfig& config,
                                                   const A100Cluster& cluster) {
  const int t = config.tensor_parallel, p = config.pipeline_parallel, d = config.data_parallel;
  const int v = config.interleave_chunks;
  if (t < 1 || p < 1 || d < 1 || v < 1 || config.microbatch_size < 1) {
    return absl::InvalidArgumentError("megatron config: degrees must be at least 1");
  }
  if (t > cluster.gpus_per_node) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron config: tensor_parallel ", t, " exceeds a node of ",
                     cluster.gpus_per_node, " GPUs"));
  }
  if (model.layers % (p * v) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("megatron config: ", model.layers,
                                                   " layers do not split into ", p, " x ", v,
                                                   " chunks"));
  }
  const int64_t samples_per_pipeline = config.global_batch / d;
  if (samples_per_pipeline * d != config.global_batch ||
      samples_per_pipeline % config.microbatch_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron config: batch ", config.global_batch, " does not split into ", d,
                     " replicas of micro-batches of ", config.microbatch_size));
  }
  const int m = static_cast<int>(samples_per_pipeline / config.microbatch_size);

  const double b = config.microbatch_size, s = model.sequence, h = model.hidden,
               a = model.heads, vocab = model.vocabulary;
  const double sbh = s * b * h;
  const double boundary_bytes = kBytesPerValue * sbh;
  const double effective_flops = cluster.peak_flops * cluster.gemm_efficiency;
  const double tp_all_reduce = RingAllReduceSeconds(boundary_bytes, t,
                                                    cluster.nvlink_bytes_per_second,
                                                    cluster.latency_seconds);
  // One pass of one transformer layer (forward; backward is twice the compute).
  const double layer_gemm = (24 * b * s * h * h + 4 * b * s * s * h) / t / effective_flops;
  const double activation_bytes = sbh * (10 + 24.0 / t + 5 * a * s / (h * t));
  const double layer_other =
      cluster.elementwise_traffic * activation_bytes / cluster.hbm_bytes_per_second;
  const double layer_compute = layer_gemm + layer_other;
  const double layer_forward = layer_compute + kAllReducesPerPass * tp_all_reduce;
  const double layer_backward = 2 * layer_compute + kAllReducesPerPass * tp_all_reduce +
                                (config.recompute ? layer_forward : 0.0);
  // Logits (last stage) and embedding (first stage).
  const double head_compute =
      2 * b * s * h * vocab / t / effective_flops +
      cluster.elementwise_traffic * kLogitBytesPerValue * s * b * vocab / t /
          cluster.hbm_bytes_per_second;
  const double embedding_forward = tp_all_reduce;

  // Pipeline transfers: scatter over t InfiniBand adapters, all-gather over NVLink. Pipeline
  // neighbours are t * d ranks apart.
  const bool p2p_inside_node = t * d * p <= cluster.gpus_per_node;
  double p2p_bandwidth = cluster.infiniband_bytes_per_second_per_gpu;
  double p2p_bytes = boundary_bytes / t;
  double p2p_latency = cluster.latency_seconds +
                       (t > 1 ? (t - 1.0) / t * boundary_bytes / cluster.nvlink_bytes_per_second
                              : 0.0);
  if (p2p_inside_node) {
    p2p_bandwidth = cluster.nvlink_bytes_per_second;
    p2p_bytes = boundary_bytes;
    p2p_latency = cluster.latency_seconds;
  }

  pipeline::ScheduleSpec spec;
  spec.kind = v > 1 ? pipeline::ScheduleKind::kInterleaved : pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = p;
  spec.num_microbatches = m;
  spec.chunks = v;
  const int num_stages = p * v;
  const int layers_per_stage = model.layers / num_stages;
  std::vector<double> forward(num_stages), backward(num_stages), bytes(num_stages, p2p_bytes);
  for (int stage = 0; stage < num_stages; ++stage) {
    forward[stage] = layers_per_stage * layer_forward;
    backward[stage] = layers_per_stage * layer_backward;
  }
  forward.front() += embedding_forward;
  forward.back() += head_compute;
  backward.back() += 2 * head_compute;

  TANDEM_ASSIGN_OR_RETURN(pipeline::Schedule schedule, pipeline::GenerateSchedule(spec));
  TANDEM_ASSIGN_OR_RETURN(pipeline::CostModel costs,
                          pipeline::CostModel::FromStageCosts(spec, forward, backward, {}, bytes));
  costs.p2p_bandwidth_bytes_per_second = p2p_bandwidth;
  costs.p2p_latency_seconds = p2p_latency;
  TANDEM_ASSIGN_OR_RETURN(pipeline::SimulationResult simulated,
                          pipeline::Simulate(schedule, costs));

  // Parameters held by the busiest GPU (first pipeline rank: its layers and the embedding).
  const double layer_parameters = 12 * h * h + 13 * h;
  const double embedding_parameters = (vocab + s) * h;
  const double rank_parameters =
      (model.layers / p * layer_parameters + embedding_parameters) / t;
  // Gradients: one ring per data-parallel group; 8 / t of its GPUs share a node and drive as
  // many InfiniBand adapters.
  const int group_per_node = std::max(1, std::min(d, cluster.gpus_per_node / t));
  const double dp_bandwidth =
      d <= group_per_node ? cluster.nvlink_bytes_per_second
                          : group_per_node * cluster.infiniband_bytes_per_second_per_gpu;
  double gradient_seconds = RingAllReduceSeconds(kBytesPerValue * rank_parameters, d,
                                                 dp_bandwidth, cluster.latency_seconds);
  if (p > 1) {  // tied embedding: first and last stage sum their copies' gradients
    gradient_seconds += RingAllReduceSeconds(kBytesPerValue * vocab * h / t, 2,
                                             cluster.infiniband_bytes_per_second_per_gpu,
                                             cluster.latency_seconds);
  }
  const double optimizer_seconds =
      kOptimizerTrafficPerParameter * rank_parameters / cluster.hbm_bytes_per_second;

  MegatronPrediction prediction;
  prediction.pipeline_seconds = simulated.makespan_seconds;
  prediction.data_parallel_seconds = gradient_seconds;
  prediction.optimizer_seconds = optimizer_seconds;
  prediction.iteration_seconds = simulated.makespan_seconds + gradient_seconds + optimizer_seconds;
  prediction.tflops_per_gpu = MegatronIterationFlops(model, config.global_batch) /
                              (double(config.Gpus()) * prediction.iteration_seconds) / 1e12;
  prediction.bubble_ratio = simulated.bubble_ratio;
  prediction.layer_forward_seconds = layer_forward;
  prediction.tensor_parallel_seconds =
      (config.recompute ? 3 : 2) * kAllReducesPerPass * tp_all_reduce;
  prediction.microbatches = m;
  prediction.schedule = spec;
  prediction.simulated_actions = simulated.simulated_actions;

  prediction.memory_bytes = MegatronMemoryBytes(model, config);
  return prediction;
}

double MegatronMemoryBytes(const MegatronGpt& model, const MegatronConfig& config) {
  const int t = config.tensor_parallel, p = config.pipeline_parallel;
  const int v = config.interleave_chunks;
  const double b = config.microbatch_size, s = model.sequence, h = model.hidden,
               a = model.heads, vocab = model.vocabulary;
  const double sbh = s * b * h;
  const double activation_bytes = sbh * (10 + 24.0 / t + 5 * a * s / (h * t));
  const double rank_parameters =
      (double(model.layers) / p * (12 * h * h + 13 * h) + (vocab + s) * h) / t;
  const int64_t microbatches =
      config.global_batch / config.data_parallel / config.microbatch_size;
  const double in_flight_chunks = v > 1 ? 2.0 * (p - 1) + (v - 1.0) * p + 1 : double(p);
  const double layers_per_chunk = double(model.layers) / (p * v);
  const double stash_per_layer = config.recompute ? kBytesPerValue * sbh : activation_bytes;
  return kStateBytesPerParameter * rank_parameters +
         std::min<double>(in_flight_chunks, double(microbatches) * v) * layers_per_chunk *
             stash_per_layer +
         activation_bytes;
}

absl::StatusOr<MegatronSearchResult> SearchMegatronConfig(const MegatronGpt& model, int gpus,
                                                          int64_t global_batch,
                                                          const A100Cluster& cluster) {
  MegatronSearchResult best;
  double smallest_memory = 0;
  bool found = false;
  for (int t : {1, 2, 4, 8}) {
    if (t > cluster.gpus_per_node || gpus % t != 0) continue;
    for (int p = 1; p <= model.layers && t * p <= gpus; ++p) {
      if (model.layers % p != 0 || (gpus / t) % p != 0) continue;
      const int d = gpus / (t * p);
      if (global_batch % d != 0) continue;
      for (int b : {1, 2, 4, 8}) {
        if ((global_batch / d) % b != 0) continue;
        for (int v : {1, 2, 3, 4}) {
          if (v > 1 && (p == 1 || (model.layers / p) % v != 0)) continue;
          for (bool recompute : {true, false}) {
            MegatronConfig config;
            config.tensor_parallel = t;
            config.pipeline_parallel = p;
            config.data_parallel = d;
            config.global_batch = global_batch;
            config.microbatch_size = b;
            config.interleave_chunks = v;
            config.recompute = recompute;
            ++best.candidates;
            const double memory = MegatronMemoryBytes(model, config);
            if (smallest_memory == 0 || memory < smallest_memory) smallest_memory = memory;
            if (cluster.memory_bytes > 0 && memory > cluster.memory_bytes) continue;
            ++best.simulated;
            TANDEM_ASSIGN_OR_RETURN(MegatronPrediction prediction,
                                    PredictMegatron(model, config, cluster));
            if (!found || prediction.tflops_per_gpu > best.prediction.tflops_per_gpu) {
              found = true;
              best.config = config;
              best.prediction = prediction;
            }
          }
        }
      }
    }
  }
  if (!found) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no configuration fits ", cluster.memory_bytes / 1e9,
                     " GB per GPU; the smallest needs ", smallest_memory / 1e9, " GB"));
  }
  return best;
}

std::vector<MegatronTableRow> MegatronTable1() {
  // Narayanan et al., SC'21, Table 1: parameters (billions), heads, hidden, layers, t, p,
  // GPUs, batch, achieved teraFLOP/s per GPU, percentage of peak, aggregate petaFLOP/s.
  struct Published {
    double billions;
    int heads, hidden, layers, t, p, gpus, batch;
    double tflops, percent, pflops;
  };
  static constexpr Published kRows[] = {
      {1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4},
      {3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8},
      {7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2},
      {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6},
      {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8},
      {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8},
      {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1},
      {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4},
      {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2},
      {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0},
  };
  std::vector<MegatronTableRow> rows;
  for (const Published& published : kRows) {
    MegatronTableRow row;
    row.parameters_billions = published.billions;
    row.model.layers = published.layers;
    row.model.hidden = published.hidden;
    row.model.heads = published.heads;
    row.config.tensor_parallel = published.t;
    row.config.pipeline_parallel = published.p;
    row.config.data_parallel = published.gpus / (published.t * published.p);
    row.config.global_batch = published.batch;
    row.config.microbatch_size = 1;
    const int layers_per_rank = published.layers / published.p;
    row.config.interleave_chunks = 1;
    if (published.p > 1) {
      for (int v = 2; v <= layers_per_rank; ++v) {
        if (layers_per_rank % v == 0) {
          row.config.interleave_chunks = v;
          break;
        }
      }
    }
    row.published_tflops_per_gpu = published.tflops;
    row.published_percent_of_peak = published.percent;
    row.published_aggregate_pflops = published.pflops;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace tandem::planner
