#include "cli/torch/shard_profiles.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/options.h"
#include "common/status.h"
#include "common/units.h"
#include "runtime/devices.h"

namespace tandem::cli {

std::string ShardName(int degree, bool sequence_parallel, int expert_parallel) {
  return absl::StrCat(
      "tensor parallelism ", degree, sequence_parallel ? " with sequence parallelism" : "",
      expert_parallel > 1 ? absl::StrCat(" (experts on ", expert_parallel, " parts)") : "");
}

std::vector<int> ExpertPartsToMeasure(int expert_parallel, int degree) {
  std::vector<int> parts;
  if (expert_parallel == 0) {
    for (int n = 1; n <= degree; ++n) {
      if (degree % n == 0) parts.push_back(n);
    }
  } else if (degree % expert_parallel == 0) {
    parts.push_back(expert_parallel);
  }
  return parts;
}

absl::StatusOr<std::vector<ShardProfile>> ProfileShards(
    comm::Communicator& world, const runtime::libtorch::ProfilerOptions& base,
    const runtime::libtorch::LayeredModel& model, const runtime::libtorch::Dataset& data,
    const ShardMeasurements& measure, std::ostream& out) {
  const torch::Device device = base.device;
  std::vector<ShardProfile> shards;
  if (!model.shard_for_tensor_parallel) return shards;
  // A failure skips the remaining measurements but not the splits, which every rank makes.
  absl::Status failed = absl::OkStatus();
  for (int t : measure.degrees) {
    if (t > world.size() || world.size() % t != 0) continue;
    const bool member = world.rank() < t;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> group,
                            world.Split(member ? 0 : -1, world.rank()));
    if (!member || !failed.ok()) continue;
    // Where NCCL carries device buffers the group's collectives run over it, as the runtime
    // runs them (null: the MPI group; CUDA shards then reduce host copies).
    absl::StatusOr<std::unique_ptr<comm::Communicator>> nccl = nullptr;
    if (device.is_cuda()) {
      absl::StatusOr<comm::CommOptions> comm_options = comm::CommOptions::FromEnvironment();
      if (comm_options.ok()) comm_options->timeout = group->timeout();
      nccl = comm_options.ok() ? runtime::NcclGroupIfPossible(
                                     *group, device.has_index() ? device.index() : 0, *comm_options)
                               : comm_options.status();
    }
    if (!nccl.ok()) {
      failed = Annotate(nccl.status(), absl::StrCat("tensor parallelism ", t));
      continue;
    }
    std::vector<std::pair<bool, int>> ways;
    for (int parts : ExpertPartsToMeasure(measure.expert_parallel, t)) {
      for (bool sequence_parallel : measure.sequence_parallel) {
        ways.emplace_back(sequence_parallel, parts);
      }
    }
    for (const auto& [sequence_parallel, expert_parallel] : ways) {
      const std::string name = ShardName(t, sequence_parallel, expert_parallel);
      if (world.rank() == 0) {
        out << "profiling the shards of " << name << " on ranks 0-" << t - 1 << " ..." << std::endl;
      }
      runtime::libtorch::ProfilerOptions options = base;
      options.tensor_parallel = {t, world.rank(), *nccl != nullptr ? nccl->get() : group.get()};
      options.tensor_parallel.sequence_parallel = sequence_parallel;
      options.tensor_parallel.expert_parallel = expert_parallel;
      absl::StatusOr<pipeline::Profile> shard =
          runtime::libtorch::ProfileModel(model, data, options);
      // A degree the model does not split into (heads, vocabulary, a sequence for sequence
      // parallelism): the same answer on every rank of the group, before any collective; that
      // variant is left out.
      if (!shard.ok() && absl::IsInvalidArgument(shard.status())) {
        if (world.rank() == 0) {
          out << "  " << name << " left out: " << shard.status().message() << std::endl;
        }
        continue;
      }
      if (!shard.ok()) {
        failed = Annotate(shard.status(), name);
        break;
      }
      if (world.rank() == 0) {
        shards.push_back({t, sequence_parallel, expert_parallel, *std::move(shard)});
      }
    }
  }
  if (!failed.ok()) return failed;
  return shards;
}

absl::Status AddShardVariants(const std::vector<ShardProfile>& shards, pipeline::Profile* profile,
                              std::ostream& out) {
  for (const ShardProfile& shard : shards) {
    const std::vector<pipeline::LayerProfile>& layers = shard.profile.layers;
    if (layers.size() != profile->layers.size()) {
      return absl::InternalError("a shard profile with another number of layers");
    }
    double whole = 0, split = 0, whole_stash = 0, split_stash = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      whole += profile->layers[l].forward_seconds + profile->layers[l].backward_seconds;
      split += layers[l].forward_seconds + layers[l].backward_seconds;
      whole_stash += profile->layers[l].stashed_activation_bytes;
      split_stash += layers[l].stashed_activation_bytes;
    }
    out << absl::StrFormat(
               "%s measured: forward + backward %.3f ms per micro-batch on each rank "
               "(%.2fx one device's, collectives included), %s stashed (%.2fx)",
               ShardName(shard.degree, shard.sequence_parallel, shard.expert_parallel), split * 1e3,
               whole > 0 ? split / whole : 0.0, FormatBytes(split_stash),
               whole_stash > 0 ? split_stash / whole_stash : 0.0)
        << std::endl;
    for (size_t l = 0; l < layers.size(); ++l) {
      const pipeline::LayerProfile& measured = layers[l];
      pipeline::TensorParallelVariant variant;
      variant.degree = shard.degree;
      variant.sequence_parallel = shard.sequence_parallel;
      variant.expert_parallel = shard.expert_parallel;
      variant.forward_seconds = measured.forward_seconds;
      variant.backward_seconds = measured.backward_seconds;
      variant.stashed_activation_bytes = measured.stashed_activation_bytes;
      variant.parameter_bytes = measured.parameter_bytes;
      profile->layers[l].tensor_parallel.push_back(variant);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cli
