#include "planner/layer_chain.h"

#include <algorithm>

#include "common/status.h"

namespace tandem::planner {
namespace {

std::vector<double> PrefixSums(const std::vector<pipeline::LayerProfile>& layers,
                               double (*field)(const pipeline::LayerProfile&)) {
  std::vector<double> prefix(layers.size() + 1, 0.0);
  for (size_t i = 0; i < layers.size(); ++i) prefix[i + 1] = prefix[i] + field(layers[i]);
  return prefix;
}

}  // namespace

absl::StatusOr<LayerChain> LayerChain::FromProfile(const pipeline::Profile& profile) {
  TANDEM_RETURN_IF_ERROR(
      pipeline::ValidateProfile(profile, profile.model.empty() ? "profile" : profile.model));
  LayerChain chain;
  chain.layers_ = profile.layers;
  const auto& layers = chain.layers_;
  using Layer = pipeline::LayerProfile;
  chain.forward_ = PrefixSums(layers, [](const Layer& l) { return l.forward_seconds; });
  chain.backward_ = PrefixSums(layers, [](const Layer& l) { return l.backward_seconds; });
  chain.compute_ = PrefixSums(
      layers, [](const Layer& l) { return l.forward_seconds + l.backward_seconds; });
  chain.recompute_ = PrefixSums(layers, [](const Layer& l) { return l.recompute_seconds; });
  chain.parameters_ = PrefixSums(layers, [](const Layer& l) { return l.parameter_bytes; });
  chain.optimizer_ = PrefixSums(layers, [](const Layer& l) { return l.optimizer_state_bytes; });
  chain.stashed_ = PrefixSums(layers, [](const Layer& l) { return l.stashed_activation_bytes; });
  chain.recompute_stashed_ =
      PrefixSums(layers, [](const Layer& l) { return l.recompute_stashed_bytes; });

  // last_consumer[u]: the latest layer reading u's output (u itself when nothing does).
  const int n = static_cast<int>(layers.size());
  std::vector<int> last_consumer(n);
  for (int u = 0; u < n; ++u) last_consumer[u] = u;
  for (int v = 0; v < n; ++v) {
    if (layers[v].inputs.empty()) {
      if (v > 0) last_consumer[v - 1] = std::max(last_consumer[v - 1], v);
    } else {
      for (int u : layers[v].inputs) last_consumer[u] = std::max(last_consumer[u], v);
    }
  }
  // u's output crosses every cut c with u < c <= last_consumer[u].
  std::vector<double> delta(n + 2, 0.0);
  for (int u = 0; u < n; ++u) {
    if (last_consumer[u] > u) {
      delta[u + 1] += layers[u].output_activation_bytes;
      delta[last_consumer[u] + 1] -= layers[u].output_activation_bytes;
    }
  }
  chain.cut_bytes_.assign(n + 1, 0.0);
  double running = 0;
  for (int c = 1; c < n; ++c) {
    running += delta[c];
    chain.cut_bytes_[c] = std::max(0.0, running);
  }
  return chain;
}

}  // namespace tandem::planner
