// A GPT profile computed from published layer shapes and device figures, for planning models
// too large to profile here (GPT-3 175B on A100s).
//
// Per transformer layer with hidden size h, a heads, sequence s and micro-batch b (bytes in
// fp16/bf16, Adam in mixed precision):
//   forward FLOPs     24 b s h^2 + 4 b s^2 h      (backward twice that)
//   parameters        12 h^2 + 13 h               (2 bytes each; gradients as much again;
//                                                  optimizer state 12 bytes per parameter)
//   activations       s b h (34 + 5 a s / h) bytes without tensor parallelism;
//                     s b h (10 + 24 / t + 5 a s / (h t)) with degree t (Korthikanti et al.,
//                     "Reducing Activation Recomputation in Large Transformer Models", 2022);
//                     s b h (34 + 5 a s / h) / t with sequence parallelism, which also divides
//                     the stage-boundary bytes and a recomputed layer's input by t
//   recomputation     re-runs the forward; keeps the layer's input (2 s b h bytes)
//   tensor parallel   four all-reduces of 2 s b h bytes per layer (after attention and after
//                     the MLP, forward and backward) over the intra-node link (ring: 2 (t-1)/t
//                     of the bytes); embedding and head are counted without them.
// With `split_blocks`, each transformer layer is two profile layers, attention and MLP, so a
// planner can recompute one without the other ("parts of a layer"). The embedding and the
// output head (logits, untied) are layers of their own.
#pragma once

#include <string>
#include <vector>

#include "pipeline/profile.h"

namespace tandem::planner {

struct GptShape {
  std::string name = "gpt3-175b";
  int layers = 96;
  int hidden = 12288;
  int heads = 96;
  int sequence = 2048;
  int vocabulary = 51200;
  int microbatch_size = 1;
  bool split_blocks = false;
  std::vector<int> tensor_parallel_degrees = {2, 4, 8};
  bool sequence_parallel = false;  // the variants run with sequence parallelism
};

struct DeviceFigures {
  std::string name = "A100-80GB";
  double peak_flops = 312e12;      // bf16 dense
  double efficiency = 0.5;         // fraction of peak reached by the layer's kernels
  double tensor_parallel_bandwidth_bytes_per_second = 300e9;  // NVLink, per direction
};

// GPT-3 175B (Brown et al. 2020): 96 layers, h = 12288, 96 heads, sequence 2048.
GptShape Gpt3Shape();
DeviceFigures A100Figures();

pipeline::Profile MakeGptProfile(const GptShape& shape, const DeviceFigures& device);

}  // namespace tandem::planner
