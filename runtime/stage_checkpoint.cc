#include "runtime/stage_checkpoint.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/control.h"

namespace tandem::runtime {
namespace {

constexpr char kParameterPrefix[] = "param:";
constexpr char kOptimizerPrefix[] = "optim:";

ShardTensor FloatTensor(const std::string& name, const float* data, int64_t count) {
  ShardTensor t;
  t.name = name;
  t.dtype = comm::DataType::kFloat32;
  t.count = count;
  t.bytes.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(count) * sizeof(float));
  return t;
}

// A float32 buffer on a stage's device, copied to the host.
absl::StatusOr<ShardTensor> DeviceFloatTensor(DeviceOps& ops, const std::string& name,
                                              const comm::Buffer& buffer) {
  std::vector<float> host(static_cast<size_t>(buffer.count));
  TANDEM_RETURN_IF_ERROR(
      ops.CopyToHost(host.data(), static_cast<const float*>(buffer.data), buffer.count));
  return FloatTensor(name, host.data(), buffer.count);
}

nlohmann::json OptimizerJson(const OptimizerConfig& c) {
  return {{"kind", OptimizerName(c.kind)}, {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},      {"beta1", c.beta1},
          {"beta2", c.beta2},                    {"eps", c.eps}};
}

}  // namespace

absl::Status SaveStages(const std::string& dir, const std::string& model, int64_t step,
                        const CheckpointScope& scope,
                        const std::vector<CheckpointedStage>& stages) {
  comm::Communicator* control = scope.control;
  const int world_rank = control->rank();
  // The folder exists and holds no manifest before any shard is written.
  absl::Status local = absl::OkStatus();
  if (world_rank == 0) {
    local = EnsureDirectory(dir);
    if (local.ok()) local = RemoveManifest(dir);
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control, local, "preparing the checkpoint folder"));

  // Every member of a gradient group gathers the stage's optimizer state (collective for
  // DeAR, whose state is sharded); the group's first rank writes the shard.
  nlohmann::json records = nlohmann::json::array();
  local = [&]() -> absl::Status {
    for (const CheckpointedStage& l : stages) {
      TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> state,
                              l.sync->GatherOptimizerState());
      if (l.group->rank() != 0) continue;
      CheckpointShard shard;
      shard.stage = l.stage;
      nlohmann::json steps = nlohmann::json::object();
      for (const ParameterView& v : *l.parameters) {
        if (v.value.dtype != comm::DataType::kFloat32) {
          return absl::UnimplementedError(absl::StrCat("checkpoint of parameter '", v.name,
                                                       "': only float32 parameters"));
        }
        TANDEM_ASSIGN_OR_RETURN(
            ShardTensor tensor,
            DeviceFloatTensor(*l.ops, absl::StrCat(kParameterPrefix, v.name), v.value));
        shard.tensors.push_back(std::move(tensor));
      }
      for (const ParameterOptimizerState& p : state) {
        steps[p.name] = p.steps;
        for (const auto& [buffer, values] : p.buffers) {
          shard.tensors.push_back(
              FloatTensor(absl::StrCat(kOptimizerPrefix, p.name, ":", buffer), values.data(),
                          static_cast<int64_t>(values.size())));
        }
      }
      shard.metadata = {{"optimizer_steps", steps}, {"layers", {l.first_layer, l.end_layer}}};
      TANDEM_ASSIGN_OR_RETURN(ShardRecord record, WriteShard(dir, shard));
      records.push_back({{"stage", record.stage}, {"part", record.part},
                         {"num_parts", record.num_parts}, {"file", record.file},
                         {"bytes", record.bytes}, {"checksum", record.checksum}});
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      control,
      Annotate(local, absl::StrCat("rank ", world_rank, ": writing checkpoint shards")),
      "writing checkpoint shards"));

  // Rank 0 writes the manifest last, with every shard's checksum.
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherStrings(*control, records.dump()));
  local = absl::OkStatus();
  if (world_rank == 0) {
    CheckpointManifest manifest;
    manifest.model = model;
    manifest.plan = pipeline::ToJson(*scope.plan);
    manifest.step = step;
    manifest.data_position = {{"next_iteration", step}};
    manifest.optimizer = OptimizerJson(scope.optimizer);
    local = [&]() -> absl::Status {
      for (const std::string& text : all) {
        nlohmann::json rank_records = nlohmann::json::parse(text, nullptr, false);
        nlohmann::json wrapper = {{"format_version", kCheckpointFormatVersion}, {"model", model},
                                  {"step", 0}, {"plan", nlohmann::json::object()},
                                  {"shards", rank_records}};
        TANDEM_ASSIGN_OR_RETURN(CheckpointManifest part,
                                ManifestFromJson(wrapper, "gathered shard records"));
        for (ShardRecord& r : part.shards) manifest.shards.push_back(std::move(r));
      }
      std::sort(manifest.shards.begin(), manifest.shards.end(),
                [](const ShardRecord& a, const ShardRecord& b) { return a.stage < b.stage; });
      if (static_cast<int>(manifest.shards.size()) != scope.num_stages) {
        return absl::InternalError(absl::StrCat("checkpoint has ", manifest.shards.size(),
                                                " shards for ", scope.num_stages,
                                                " stages"));
      }
      return WriteManifest(dir, manifest);
    }();
  }
  return AgreeOnSuccess(control, local, "writing the checkpoint manifest");
}

absl::Status SaveCheckpointStep(const std::string& root, const std::string& model, int64_t step,
                                int keep, const CheckpointScope& scope,
                                const std::vector<CheckpointedStage>& stages) {
  comm::Communicator* control = scope.control;
  const std::string partial = absl::StrCat(root, "/", PartialFolderName(step));
  absl::Status local = absl::OkStatus();
  if (control->rank() == 0) {
    local = EnsureDirectory(root);
    if (local.ok()) local = CleanCheckpointLeftovers(root);
    if (local.ok()) local = EnsureDirectory(partial);
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control, local, "preparing the checkpoint folder"));
  TANDEM_RETURN_IF_ERROR(SaveStages(partial, model, step, scope, stages));
  local = control->rank() == 0 ? PublishCheckpoint(root, partial, step, keep) : absl::OkStatus();
  return AgreeOnSuccess(control, local, "publishing the checkpoint");
}

absl::StatusOr<int64_t> LoadStages(const std::string& dir, const std::string& model,
                                   const CheckpointScope& scope,
                                   const std::vector<CheckpointedStage>& stages) {
  comm::Communicator* control = scope.control;
  const int world_rank = control->rank();
  const pipeline::Plan& plan = *scope.plan;
  int64_t step = 0;
  std::vector<std::vector<ParameterOptimizerState>> states(stages.size());
  absl::Status local = [&]() -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
    if (manifest.model != model) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint is of model '",
                                                     manifest.model, "', this run trains '",
                                                     model, "'"));
    }
    auto saved_plan = pipeline::PlanFromJson(manifest.plan, absl::StrCat(dir, ": plan"));
    if (!saved_plan.ok()) return saved_plan.status();
    if (saved_plan->stages.size() != plan.stages.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the checkpoint has ", saved_plan->stages.size(), " stages, this plan ",
          plan.stages.size()));
    }
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const auto& a = saved_plan->stages[s];
      const auto& b = plan.stages[s];
      if (a.first_layer != b.first_layer || a.end_layer != b.end_layer) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": stage ", s, " holds layers [", a.first_layer, ", ", a.end_layer,
            ") in the checkpoint but [", b.first_layer, ", ", b.end_layer, ") in this plan"));
      }
    }
    const nlohmann::json* kind = manifest.optimizer.is_object() && manifest.optimizer.contains("kind")
                                     ? &manifest.optimizer["kind"]
                                     : nullptr;
    const std::string saved_optimizer =
        kind != nullptr && kind->is_string() ? kind->get<std::string>() : "(none)";
    if (saved_optimizer != OptimizerName(scope.optimizer.kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the checkpoint's optimizer is '", saved_optimizer, "', this run uses '",
          OptimizerName(scope.optimizer.kind), "'"));
    }
    step = manifest.step;
    for (size_t i = 0; i < stages.size(); ++i) {
      const CheckpointedStage& l = stages[i];
      const ShardRecord* record = manifest.FindShard(l.stage, 0);
      if (record == nullptr) {
        return absl::NotFoundError(absl::StrCat(dir, ": the manifest lists no shard of stage ",
                                                l.stage));
      }
      TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ReadShard(dir, *record));
      const std::string where = absl::StrCat(dir, "/", record->file);
      for (const ParameterView& v : *l.parameters) {
        const ShardTensor* t = shard.Find(absl::StrCat(kParameterPrefix, v.name));
        if (t == nullptr || t->count != v.value.count ||
            t->dtype != comm::DataType::kFloat32) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": parameter '", v.name, "' is missing or has another size (",
              t == nullptr ? 0 : t->count, " vs ", v.value.count, ")"));
        }
        std::vector<float> host(static_cast<size_t>(t->count));
        std::memcpy(host.data(), t->bytes.data(), t->bytes.size());
        TANDEM_RETURN_IF_ERROR(
            l.ops->CopyFromHost(static_cast<float*>(v.value.data), host.data(), t->count));
      }
      const nlohmann::json steps =
          shard.metadata.is_object() && shard.metadata.contains("optimizer_steps")
              ? shard.metadata["optimizer_steps"]
              : nlohmann::json::object();
      if (!steps.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": optimizer_steps must be an object of step counts"));
      }
      std::vector<ParameterOptimizerState>& state = states[i];
      const std::vector<ParameterView>& params = *l.parameters;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {  // registration order
        ParameterOptimizerState p;
        p.name = it->name;
        if (steps.contains(it->name)) {
          const nlohmann::json& n = steps[it->name];
          if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > step) {
            return absl::InvalidArgumentError(absl::StrCat(
                where, ": optimizer steps of '", it->name, "' must be an integer in [0, ", step,
                "], got ", n.dump()));
          }
          p.steps = n.get<int64_t>();
        }
        const std::string prefix = absl::StrCat(kOptimizerPrefix, it->name, ":");
        for (const ShardTensor& t : shard.tensors) {
          if (t.name.rfind(prefix, 0) != 0) continue;
          std::vector<float> values(static_cast<size_t>(t.count));
          std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
          p.buffers.emplace_back(t.name.substr(prefix.size()), std::move(values));
        }
        state.push_back(std::move(p));
      }
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      control, Annotate(local, absl::StrCat("rank ", world_rank, ": loading checkpoint")),
      "loading the checkpoint"));
  local = [&]() -> absl::Status {
    for (size_t i = 0; i < stages.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(stages[i].sync->LoadOptimizerState(states[i]));
    }
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control, local, "loading optimizer state"));
  return step;
}

}  // namespace tandem::runtime
