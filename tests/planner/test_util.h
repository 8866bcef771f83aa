// Helpers shared by the planner tests: random small profiles and data paths.
#pragma once

#include <random>
#include <string>

#include "pipeline/profile.h"

namespace tandem::planner::testing {

inline std::string DataPath(const std::string& relative) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/" + relative;
}

// A chain of `layers` layers of one second forward each, nothing else.
inline pipeline::Profile UniformProfile(int layers) {
  pipeline::Profile profile;
  for (int i = 0; i < layers; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = 1;
    profile.layers.push_back(layer);
  }
  return profile;
}

// A chain of `layers` layers with random costs (times in [0.1, 1], sizes in [0, 10]).
inline pipeline::Profile RandomProfile(int layers, std::mt19937* rng) {
  std::uniform_real_distribution<double> time(0.1, 1.0);
  std::uniform_real_distribution<double> size(0.0, 10.0);
  pipeline::Profile profile;
  profile.model = "random";
  for (int i = 0; i < layers; ++i) {
    pipeline::LayerProfile layer;
    layer.name = "l" + std::to_string(i);
    layer.forward_seconds = time(*rng);
    layer.backward_seconds = 2 * time(*rng);
    layer.output_activation_bytes = size(*rng);
    layer.stashed_activation_bytes = size(*rng);
    layer.parameter_bytes = size(*rng);
    layer.optimizer_state_bytes = size(*rng);
    layer.recompute_seconds = layer.forward_seconds;
    layer.recompute_stashed_bytes = layer.stashed_activation_bytes * 0.2;
    profile.layers.push_back(layer);
  }
  return profile;
}

}  // namespace tandem::planner::testing
