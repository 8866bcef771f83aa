#include "runtime/stage_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/control.h"

namespace tandem::runtime {
namespace {

constexpr char kParameterPrefix[] = "param:";
constexpr char kOptimizerPrefix[] = "optim:";

// `shape` where it holds `count` elements, else flat.
ShardTensor FloatTensor(const std::string& name, const float* data, int64_t count,
                        const std::vector<int64_t>& shape) {
  ShardTensor t;
  t.name = name;
  t.dtype = comm::DataType::kFloat32;
  t.count = count;
  t.shape = !shape.empty() && ShapeElements(shape) == count ? shape : std::vector<int64_t>{count};
  t.bytes.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(count) * sizeof(float));
  return t;
}

nlohmann::json OptimizerJson(const OptimizerConfig& c) {
  return {{"kind", OptimizerName(c.kind)}, {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},      {"beta1", c.beta1},
          {"beta2", c.beta2},                    {"eps", c.eps}};
}

}  // namespace

CheckpointShard ShardOf(int stage, int first_layer, int end_layer,
                        const std::vector<ParameterState>& parameters) {
  CheckpointShard shard;
  shard.stage = stage;
  nlohmann::json steps = nlohmann::json::object();
  for (const ParameterState& p : parameters) {
    shard.tensors.push_back(FloatTensor(absl::StrCat(kParameterPrefix, p.name), p.value.data(),
                                        static_cast<int64_t>(p.value.size()), p.shape));
  }
  for (const ParameterState& p : parameters) {
    steps[p.name] = p.optimizer.steps;
    for (const auto& [buffer, values] : p.optimizer.buffers) {
      shard.tensors.push_back(FloatTensor(absl::StrCat(kOptimizerPrefix, p.name, ":", buffer),
                                          values.data(), static_cast<int64_t>(values.size()),
                                          p.shape));
    }
  }
  shard.metadata = {{"optimizer_steps", steps}, {"layers", {first_layer, end_layer}}};
  return shard;
}

namespace {

// The shards of the stages this rank writes: every member of a gradient group gathers the
// stage's optimizer state (collective for DeAR, whose state is sharded); the group's first
// rank keeps the shard.
absl::StatusOr<std::vector<CheckpointShard>> StageShards(
    const std::vector<CheckpointedStage>& stages) {
  std::vector<CheckpointShard> shards;
  for (const CheckpointedStage& l : stages) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> state,
                            l.sync->GatherOptimizerState());
    if (l.group->rank() != 0) continue;
    std::map<std::string, ParameterOptimizerState> by_name;
    for (ParameterOptimizerState& o : state) by_name[o.name] = std::move(o);
    std::vector<ParameterState> parameters;
    for (const ParameterView& v : *l.parameters) {
      if (v.is_tied_copy()) continue;  // saved once, as its owner (runtime/stage.h)
      if (v.value.dtype != comm::DataType::kFloat32) {
        return absl::UnimplementedError(absl::StrCat("checkpoint of parameter '", v.name,
                                                     "': only float32 parameters"));
      }
      ParameterState p;
      p.name = v.name;
      p.shape = v.shape;
      p.value.resize(static_cast<size_t>(v.value.count));
      TANDEM_RETURN_IF_ERROR(l.ops->CopyToHost(
          p.value.data(), static_cast<const float*>(v.value.data), v.value.count));
      auto it = by_name.find(v.name);
      if (it != by_name.end()) p.optimizer = std::move(it->second);
      parameters.push_back(std::move(p));
    }
    // Optimizer state in the synchroniser's (backward) order, as before.
    std::reverse(parameters.begin(), parameters.end());
    shards.push_back(ShardOf(l.stage, l.first_layer, l.end_layer, parameters));
  }
  return shards;
}

// StageShards, with every rank of scope.control learning whether any failed.
absl::StatusOr<std::vector<CheckpointShard>> AgreedStageShards(
    const CheckpointScope& scope, const std::vector<CheckpointedStage>& stages) {
  absl::StatusOr<std::vector<CheckpointShard>> shards = StageShards(stages);
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(
      scope.control,
      Annotate(shards.status(), absl::StrCat("rank ", scope.control->rank(),
                                             ": gathering checkpoint state")),
      "gathering checkpoint state"));
  return shards;
}

}  // namespace

absl::Status SaveShards(const std::string& dir, const std::string& model, int64_t step,
                        const CheckpointScope& scope, const std::vector<CheckpointShard>& shards) {
  comm::Communicator* control = scope.control;
  const int world_rank = control->rank();
  // The folder exists and holds no manifest before any shard is written.
  absl::Status local = absl::OkStatus();
  if (world_rank == 0) {
    local = EnsureDirectory(dir);
    if (local.ok()) local = RemoveManifest(dir);
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control, local, "preparing the checkpoint folder"));

  nlohmann::json records = nlohmann::json::array();
  local = [&]() -> absl::Status {
    for (const CheckpointShard& shard : shards) {
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
    manifest.run = scope.run;
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

absl::Status SaveStages(const std::string& dir, const std::string& model, int64_t step,
                        const CheckpointScope& scope,
                        const std::vector<CheckpointedStage>& stages) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<CheckpointShard> shards, AgreedStageShards(scope, stages));
  return SaveShards(dir, model, step, scope, shards);
}

absl::Status SaveShardsStep(const std::string& root, const std::string& model, int64_t step,
                            int keep, const CheckpointScope& scope,
                            const std::vector<CheckpointShard>& shards) {
  comm::Communicator* control = scope.control;
  const std::string partial = absl::StrCat(root, "/", PartialFolderName(step));
  absl::Status local = absl::OkStatus();
  if (control->rank() == 0) {
    local = EnsureDirectory(root);
    if (local.ok()) local = CleanCheckpointLeftovers(root);
    if (local.ok()) local = EnsureDirectory(partial);
  }
  TANDEM_RETURN_IF_ERROR(AgreeOnSuccess(control, local, "preparing the checkpoint folder"));
  TANDEM_RETURN_IF_ERROR(SaveShards(partial, model, step, scope, shards));
  local = control->rank() == 0 ? PublishCheckpoint(root, partial, step, keep) : absl::OkStatus();
  return AgreeOnSuccess(control, local, "publishing the checkpoint");
}

absl::Status SaveCheckpointStep(const std::string& root, const std::string& model, int64_t step,
                                int keep, const CheckpointScope& scope,
                                const std::vector<CheckpointedStage>& stages) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<CheckpointShard> shards, AgreedStageShards(scope, stages));
  return SaveShardsStep(root, model, step, keep, scope, shards);
}

namespace {

// The state `optimizer` keeps for a parameter it has stepped `steps` times.
std::vector<const char*> RequiredOptimizerBuffers(const OptimizerConfig& optimizer,
                                                  int64_t steps) {
  if (steps <= 0) return {};
  if (optimizer.kind == OptimizerKind::kAdamW) return {"exp_avg", "exp_avg_sq"};
  if (optimizer.momentum > 0) return {"momentum_buffer"};
  return {};
}

}  // namespace

absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir,
                                                    const std::string& model, int num_layers,
                                                    const OptimizerConfig& optimizer,
                                                    int first_layer, int end_layer,
                                                    bool reset_optimizer) {
  TANDEM_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
  if (manifest.model != model) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint is of model '",
                                                   manifest.model, "', this run trains '", model,
                                                   "'"));
  }
  auto saved_plan = pipeline::PlanFromJson(manifest.plan, absl::StrCat(dir, ": plan"));
  if (!saved_plan.ok()) return saved_plan.status();
  // The checkpoint may come from another partition (another world size, another plan).
  if (saved_plan->num_layers != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint's model has ",
                                                   saved_plan->num_layers, " layers, this run ",
                                                   num_layers));
  }
  const nlohmann::json* kind = manifest.optimizer.is_object() && manifest.optimizer.contains("kind")
                                   ? &manifest.optimizer["kind"]
                                   : nullptr;
  const std::string saved_optimizer =
      kind != nullptr && kind->is_string() ? kind->get<std::string>() : "(none)";
  if (saved_optimizer != OptimizerName(optimizer.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint's optimizer is '",
                                                   saved_optimizer, "', this run uses '",
                                                   OptimizerName(optimizer.kind), "'"));
  }
  CheckpointState out;
  out.step = manifest.step;
  for (size_t s = 0; s < saved_plan->stages.size(); ++s) {
    const auto& saved = saved_plan->stages[s];
    if (saved.end_layer <= first_layer || end_layer <= saved.first_layer) continue;
    const ShardRecord* record = manifest.FindShard(static_cast<int>(s), 0);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrCat(dir, ": the manifest lists no shard of stage ", s));
    }
    TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ReadShard(dir, *record));
    const std::string where = absl::StrCat(dir, "/", record->file);
    const nlohmann::json steps =
        shard.metadata.is_object() && shard.metadata.contains("optimizer_steps")
            ? shard.metadata["optimizer_steps"]
            : nlohmann::json::object();
    if (!steps.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": optimizer_steps must be an object of step counts"));
    }
    std::vector<std::string> missing;  // optimizer state tensors the shard should hold
    for (const ShardTensor& t : shard.tensors) {
      if (t.name.rfind(kParameterPrefix, 0) != 0) continue;
      if (t.dtype != comm::DataType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", t.name,
                                                       "' is not float32"));
      }
      ParameterState p;
      p.name = t.name.substr(sizeof(kParameterPrefix) - 1);
      p.shape = t.shape;
      p.value.resize(static_cast<size_t>(t.count));
      std::memcpy(p.value.data(), t.bytes.data(), t.bytes.size());
      p.optimizer.name = p.name;
      if (steps.contains(p.name)) {
        const nlohmann::json& n = steps[p.name];
        if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > out.step) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": optimizer steps of '", p.name, "' must be an integer in [0, ", out.step,
              "], got ", n.dump()));
        }
        p.optimizer.steps = n.get<int64_t>();
      }
      const std::string prefix = absl::StrCat(kOptimizerPrefix, p.name, ":");
      for (const ShardTensor& o : shard.tensors) {
        if (o.name.rfind(prefix, 0) != 0) continue;
        std::vector<float> values(static_cast<size_t>(o.count));
        std::memcpy(values.data(), o.bytes.data(), o.bytes.size());
        p.optimizer.buffers.emplace_back(o.name.substr(prefix.size()), std::move(values));
      }
      if (reset_optimizer) {
        p.optimizer.steps = 0;
        p.optimizer.buffers.clear();
      } else {
        // A stepped parameter without its state would restart the optimizer without a word.
        const int64_t stepped = steps.contains(p.name) ? p.optimizer.steps : out.step;
        for (const char* buffer : RequiredOptimizerBuffers(optimizer, stepped)) {
          const bool present = std::any_of(
              p.optimizer.buffers.begin(), p.optimizer.buffers.end(),
              [&](const auto& named) { return named.first == buffer; });
          if (!present) missing.push_back(absl::StrCat(prefix, buffer));
        }
      }
      std::string name = p.name;
      out.parameters.emplace(std::move(name), std::move(p));
    }
    if (!missing.empty()) {
      const size_t shown = std::min<size_t>(missing.size(), 4);
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", missing.size(), " optimizer state tensor(s) of stepped parameters are "
          "missing (", absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
          missing.size() > shown ? ", ..." : "", "); --reset-optimizer starts the optimizer "
          "afresh from the saved parameters"));
    }
  }
  return out;
}

ParameterState CutShard(const ParameterState& whole, const std::vector<int64_t>& index) {
  auto cut = [&](const std::vector<float>& values) {
    std::vector<float> out(index.size());
    for (size_t i = 0; i < index.size(); ++i) out[i] = values[static_cast<size_t>(index[i])];
    return out;
  };
  ParameterState shard;
  shard.name = whole.name;
  shard.value = cut(whole.value);
  shard.optimizer.name = whole.optimizer.name;
  shard.optimizer.steps = whole.optimizer.steps;
  for (const auto& [name, buffer] : whole.optimizer.buffers) {
    shard.optimizer.buffers.emplace_back(
        name, buffer.size() == whole.value.size() ? cut(buffer) : buffer);
  }
  return shard;
}

absl::StatusOr<int64_t> LoadStages(const std::string& dir, const std::string& model,
                                   const CheckpointScope& scope,
                                   const std::vector<CheckpointedStage>& stages) {
  comm::Communicator* control = scope.control;
  const int world_rank = control->rank();
  int64_t step = 0;
  std::vector<std::vector<ParameterOptimizerState>> states(stages.size());
  absl::Status local = [&]() -> absl::Status {
    for (size_t i = 0; i < stages.size(); ++i) {
      const CheckpointedStage& l = stages[i];
      TANDEM_ASSIGN_OR_RETURN(CheckpointState saved,
                              ReadCheckpointState(dir, model, scope.plan->num_layers,
                                                  scope.optimizer, l.first_layer, l.end_layer,
                                                  scope.reset_optimizer));
      step = saved.step;
      // A tied copy held apart loads its owner's state, which the stages holding the owner's
      // layer saved.
      for (const ParameterView& v : *l.parameters) {
        if (!v.is_tied_copy() || v.tied_layers.empty()) continue;
        const int owner_layer = v.tied_layers.front();
        TANDEM_ASSIGN_OR_RETURN(CheckpointState owners,
                                ReadCheckpointState(dir, model, scope.plan->num_layers,
                                                    scope.optimizer, owner_layer, owner_layer + 1,
                                                    scope.reset_optimizer));
        auto owner = owners.parameters.find(v.tied_owner);
        if (owner == owners.parameters.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": parameter '", v.tied_owner, "', to which '", v.name, "' is tied, is in "
              "none of the checkpoint's stages holding layer ", owner_layer));
        }
        ParameterState copy = std::move(owner->second);
        copy.name = v.name;
        copy.optimizer.name = v.name;
        saved.parameters[v.name] = std::move(copy);
      }
      for (const ParameterView& v : *l.parameters) {
        auto it = saved.parameters.find(v.name);
        if (it == saved.parameters.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": parameter '", v.name, "' of layers [", l.first_layer, ", ", l.end_layer,
              ") is in none of the checkpoint's stages holding those layers"));
        }
        // A tensor-parallel shard takes its elements of the whole saved parameter.
        const int64_t whole = v.tensor_parallel_index != nullptr ? v.whole_count : v.value.count;
        if (static_cast<int64_t>(it->second.value.size()) != whole) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": parameter '", v.name, "' has another size (", it->second.value.size(),
              " vs ", whole, ")"));
        }
        if (!ShapesCompatible(it->second.shape, v.shape)) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": parameter '", v.name, "' has shape ", ShapeString(it->second.shape),
              " in the checkpoint, the stage holds ", ShapeString(v.shape)));
        }
        if (v.tensor_parallel_index != nullptr) it->second = CutShard(it->second, *v.tensor_parallel_index);
        TANDEM_RETURN_IF_ERROR(l.ops->CopyFromHost(static_cast<float*>(v.value.data),
                                                   it->second.value.data(), v.value.count));
      }
      const std::vector<ParameterView>& params = *l.parameters;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {  // registration order
        states[i].push_back(saved.parameters.at(it->name).optimizer);
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
