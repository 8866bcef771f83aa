// The elastic job's checkpoints: one shard per run of layers held by the same ranks, written
// by the lowest of them, in the format any partition loads (runtime/stage_checkpoint.h); and
// the layers a rank runs, read back from one (elastic/trainer.h, ElasticOptions).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "elastic/internal/trainer_state.h"
#include "runtime/checkpoint.h"
#include "runtime/stage_checkpoint.h"

namespace tandem::elastic {

namespace {

// The partition a checkpoint of the job follows: one stage per gradient segment (a plan of
// one pipeline, which is how any run reads it back).
pipeline::Plan SegmentPlan(const std::vector<GradientSegment>& segments,
                           const ElasticOptions& options) {
  pipeline::Plan plan;
  const int n = static_cast<int>(segments.size());
  plan.model = options.model;
  plan.num_layers = options.num_layers;
  plan.world_size = n;
  plan.pipeline_parallel = n;
  plan.schedule.kind = pipeline::ScheduleKind::kGPipe;
  plan.schedule.num_ranks = n;
  plan.schedule.num_microbatches = 1;
  plan.microbatch_size = options.microbatch_size;
  plan.mesh.emplace_back();
  for (int s = 0; s < n; ++s) {
    plan.mesh[0].push_back(s);
    pipeline::PlanStage st;
    st.first_layer = segments[static_cast<size_t>(s)].layers.first_layer;
    st.end_layer = segments[static_cast<size_t>(s)].layers.end_layer;
    st.ranks = {s};
    plan.stages.push_back(st);
  }
  plan.algorithm = "elastic checkpoint (one stage per run of layers with the same holders)";
  return plan;
}

}  // namespace

absl::Status ElasticTrainer::State::SaveCheckpoint(int64_t step) {
  // Whole parameters (tensor-parallel shards gathered over their group): the checkpoint loads
  // onto any layout.
  TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> state,
                          configured().engine->ExportWholeState());
  if (kill.Hits(me, step, "checkpoint")) internal::KillSelf(me, step, "checkpoint");
  std::vector<runtime::CheckpointShard> shards;
  for (const HeldSegment& seg : held_segments()) {
    if (seg.segment.ranks.front() != me) continue;  // its lowest holder writes it
    std::vector<runtime::ParameterState> parameters;
    for (const runtime::ParameterState& p : state) {
      TANDEM_ASSIGN_OR_RETURN(int layer, LayerOfParameter(p.name));
      if (layer >= seg.segment.layers.first_layer && layer < seg.segment.layers.end_layer) {
        parameters.push_back(p);
      }
    }
    shards.push_back(runtime::ShardOf(seg.index, seg.segment.layers.first_layer,
                                      seg.segment.layers.end_layer, parameters));
  }
  const pipeline::Plan plan = SegmentPlan(all_segments, options);
  runtime::CheckpointScope scope;
  scope.control = configured().training;
  scope.plan = &plan;
  scope.num_stages = static_cast<int>(all_segments.size());
  scope.optimizer = options.engine.optimizer;
  scope.run = options.engine.checkpoint_run;
  TANDEM_RETURN_IF_ERROR(Annotate(runtime::SaveShardsStep(options.checkpoint_dir, options.model,
                                                          step, options.keep_checkpoints, scope,
                                                          shards),
                                  absl::StrCat("checkpoint of step ", step)));
  saved_step = step;
  if (on_checkpoint && reporter) on_checkpoint(step);
  return absl::OkStatus();
}

absl::StatusOr<internal::CheckpointedLayers> ElasticTrainer::State::ReadCheckpoint(
    const std::string& root) const {
  internal::CheckpointedLayers out;
  TANDEM_ASSIGN_OR_RETURN(out.folder, runtime::ResolveCheckpoint(root));
  for (const JobPipeline& p : layout.pipelines) {
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      if (p.ranks[s] != group()) continue;
      TANDEM_ASSIGN_OR_RETURN(
          runtime::CheckpointState saved,
          runtime::ReadCheckpointState(out.folder, options.model, options.num_layers,
                                       options.engine.optimizer, p.stages[s].first_layer,
                                       p.stages[s].end_layer));
      out.step = saved.step;
      out.parameters = std::move(saved.parameters);
      return out;
    }
  }
  // An idle rank reads only the step.
  TANDEM_ASSIGN_OR_RETURN(runtime::CheckpointManifest manifest,
                          runtime::ReadManifest(out.folder));
  out.step = manifest.step;
  return out;
}

}  // namespace tandem::elastic
