// A profile's layers in one fixed order (the profile's, which is topological), with prefix
// sums so that the cost of any contiguous range of layers is O(1). Every planner algorithm
// partitions this chain into contiguous stages.
//
// DAG models (layers with several inputs, skip connections) are handled by this topological
// linearization: the bytes crossing a cut between layer c-1 and layer c count the output of
// every layer before the cut that some layer at or after the cut consumes (once per producer:
// a tensor crosses a cut once however many later layers read it).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/profile.h"

namespace tandem::planner {

class LayerChain {
 public:
  // Validates the profile first (pipeline::ValidateProfile).
  static absl::StatusOr<LayerChain> FromProfile(const pipeline::Profile& profile);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const pipeline::LayerProfile& layer(int index) const { return layers_[index]; }
  const std::vector<pipeline::LayerProfile>& layers() const { return layers_; }

  // Sums over layers [first, end).
  double ForwardSeconds(int first, int end) const { return Range(forward_, first, end); }
  double BackwardSeconds(int first, int end) const { return Range(backward_, first, end); }
  // Forward plus backward.
  double ComputeSeconds(int first, int end) const { return Range(compute_, first, end); }
  double RecomputeSeconds(int first, int end) const { return Range(recompute_, first, end); }
  double ParameterBytes(int first, int end) const { return Range(parameters_, first, end); }
  double OptimizerStateBytes(int first, int end) const { return Range(optimizer_, first, end); }
  double StashedBytes(int first, int end) const { return Range(stashed_, first, end); }
  double RecomputeStashedBytes(int first, int end) const {
    return Range(recompute_stashed_, first, end);
  }
  // Bytes crossing the cut before layer `boundary` (0 < boundary < num_layers); 0 at the ends.
  double CutBytes(int boundary) const { return cut_bytes_[boundary]; }

 private:
  static double Range(const std::vector<double>& prefix, int first, int end) {
    return prefix[end] - prefix[first];
  }

  std::vector<pipeline::LayerProfile> layers_;
  // prefix[i] = sum over layers [0, i).
  std::vector<double> forward_, backward_, compute_, recompute_, parameters_, optimizer_,
      stashed_, recompute_stashed_;
  std::vector<double> cut_bytes_;  // size num_layers + 1
};

}  // namespace tandem::planner
