// The elastic trainer's pure parts (elastic/trainer.h): pipelines from an elastic plan, what
// each rank holds, the gradient segments, and moved state as bytes.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "elastic/trainer.h"

namespace tandem::elastic {
namespace {

// ---- encoding -------------------------------------------------------------------------

void PutInt(std::string* out, int64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void PutString(std::string* out, const std::string& s) {
  PutInt(out, static_cast<int64_t>(s.size()));
  out->append(s);
}
void PutFloats(std::string* out, const std::vector<float>& v) {
  PutInt(out, static_cast<int64_t>(v.size()));
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct Reader {
  const std::string& in;
  size_t at = 0;
  absl::StatusOr<int64_t> Int() {
    if (at + 8 > in.size()) return absl::DataLossError("moved state is truncated");
    int64_t v;
    std::memcpy(&v, in.data() + at, 8);
    at += 8;
    return v;
  }
  absl::StatusOr<std::string> String() {
    TANDEM_ASSIGN_OR_RETURN(int64_t n, Int());
    if (n < 0 || at + static_cast<size_t>(n) > in.size()) {
      return absl::DataLossError("moved state is truncated");
    }
    std::string s = in.substr(at, static_cast<size_t>(n));
    at += static_cast<size_t>(n);
    return s;
  }
  absl::StatusOr<std::vector<float>> Floats() {
    TANDEM_ASSIGN_OR_RETURN(int64_t n, Int());
    if (n < 0 || at + static_cast<size_t>(n) * sizeof(float) > in.size()) {
      return absl::DataLossError("moved state is truncated");
    }
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), in.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    return v;
  }
};

}  // namespace

absl::StatusOr<int> LayerOfParameter(const std::string& name) {
  constexpr absl::string_view kPrefix = "layers.";
  int layer = -1;
  if (absl::StartsWith(name, kPrefix)) {
    const size_t dot = name.find('.', kPrefix.size());
    if (dot != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(name).substr(kPrefix.size(), dot - kPrefix.size()),
                         &layer) &&
        layer >= 0) {
      return layer;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter '", name, "' is not named layers.<index>.<name>: the elastic layer moves and "
      "synchronises state by layer"));
}

std::string EncodeState(const std::vector<runtime::ParameterState>& state) {
  std::string out;
  PutInt(&out, static_cast<int64_t>(state.size()));
  for (const runtime::ParameterState& p : state) {
    PutString(&out, p.name);
    PutFloats(&out, p.value);
    PutInt(&out, p.optimizer.steps);
    PutInt(&out, static_cast<int64_t>(p.optimizer.buffers.size()));
    for (const auto& [name, values] : p.optimizer.buffers) {
      PutString(&out, name);
      PutFloats(&out, values);
    }
  }
  return out;
}

absl::StatusOr<std::vector<runtime::ParameterState>> DecodeState(const std::string& bytes) {
  Reader r{bytes};
  TANDEM_ASSIGN_OR_RETURN(int64_t n, r.Int());
  if (n < 0 || n > static_cast<int64_t>(bytes.size())) {
    return absl::DataLossError("moved state: bad parameter count");
  }
  std::vector<runtime::ParameterState> out(static_cast<size_t>(n));
  for (runtime::ParameterState& p : out) {
    TANDEM_ASSIGN_OR_RETURN(p.name, r.String());
    TANDEM_ASSIGN_OR_RETURN(p.value, r.Floats());
    p.optimizer.name = p.name;
    TANDEM_ASSIGN_OR_RETURN(p.optimizer.steps, r.Int());
    TANDEM_ASSIGN_OR_RETURN(int64_t buffers, r.Int());
    if (buffers < 0 || buffers > 64) return absl::DataLossError("moved state: bad buffer count");
    for (int64_t b = 0; b < buffers; ++b) {
      TANDEM_ASSIGN_OR_RETURN(std::string name, r.String());
      TANDEM_ASSIGN_OR_RETURN(std::vector<float> values, r.Floats());
      p.optimizer.buffers.emplace_back(std::move(name), std::move(values));
    }
  }
  if (r.at != bytes.size()) return absl::DataLossError("moved state: trailing bytes");
  return out;
}

absl::StatusOr<JobLayout> LayoutFromPlan(const ElasticPlan& plan,
                                         const std::vector<int>& live_ranks,
                                         int tensor_parallel) {
  if (tensor_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", tensor_parallel));
  }
  JobLayout layout;
  layout.global_microbatches = plan.instantiation.global_microbatches;
  layout.tensor_parallel = tensor_parallel;
  std::set<int> used;
  int64_t next = 0;
  for (const PipelineRanks& p : plan.assignment.pipelines) {
    if (p.stages.empty()) return absl::InvalidArgumentError("a pipeline without stages");
    const size_t width = p.stages[0].ranks.size();
    for (const StageRanks& s : p.stages) {
      if (s.ranks.size() != width || width == 0) {
        return absl::InvalidArgumentError(
            "a template whose stages use different numbers of devices");
      }
    }
    for (size_t k = 0; k < width; ++k) {
      JobPipeline jp;
      jp.microbatches = p.microbatches / static_cast<int64_t>(width) +
                        (static_cast<int64_t>(k) < p.microbatches % static_cast<int64_t>(width));
      for (const StageRanks& s : p.stages) {
        jp.ranks.push_back(s.ranks[k]);
        jp.stages.push_back(s.layers);
      }
      if (jp.microbatches == 0) continue;  // its ranks stay idle
      jp.first_microbatch = next;
      next += jp.microbatches;
      for (int r : jp.ranks) {
        if (r % tensor_parallel != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, " does not start a tensor-parallel group of ", tensor_parallel));
        }
        for (int t = 0; t < tensor_parallel; ++t) used.insert(r + t);
      }
      layout.pipelines.push_back(std::move(jp));
    }
  }
  if (next != layout.global_microbatches) {
    return absl::InternalError(absl::StrCat("the pipelines take ", next, " micro-batches of ",
                                            layout.global_microbatches));
  }
  for (int r : live_ranks) {
    if (!used.count(r)) layout.idle_ranks.push_back(r);
  }
  return layout;
}

HeldLayers HeldUnder(const JobLayout& layout) {
  HeldLayers held;
  for (const JobPipeline& p : layout.pipelines) {
    for (size_t s = 0; s < p.ranks.size(); ++s) held[p.ranks[s]].push_back(p.stages[s]);
  }
  return held;
}

std::string Describe(const JobLayout& layout) {
  std::vector<std::string> parts;
  for (const JobPipeline& p : layout.pipelines) {
    std::vector<std::string> stages;
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      const std::string group =
          layout.tensor_parallel > 1
              ? absl::StrCat(p.ranks[s], "-", p.ranks[s] + layout.tensor_parallel - 1)
              : absl::StrCat(p.ranks[s]);
      stages.push_back(absl::StrCat("r", group, "[", p.stages[s].first_layer, ",",
                                    p.stages[s].end_layer, ")"));
    }
    parts.push_back(absl::StrCat(absl::StrJoin(stages, " > "), " x", p.microbatches));
  }
  std::string text = absl::StrCat(layout.pipelines.size(), " pipeline(s)",
                                   layout.tensor_parallel > 1
                                       ? absl::StrCat(" of tensor-parallel groups of ",
                                                      layout.tensor_parallel)
                                       : "",
                                   ": ", absl::StrJoin(parts, " | "));
  if (!layout.idle_ranks.empty()) {
    absl::StrAppend(&text, "; idle ranks ", absl::StrJoin(layout.idle_ranks, ", "));
  }
  return text;
}

absl::StatusOr<std::vector<GradientSegment>> GradientSegments(const JobLayout& layout,
                                                              int num_layers) {
  std::vector<std::set<int>> holders(static_cast<size_t>(num_layers));
  for (const JobPipeline& p : layout.pipelines) {
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      for (int l = p.stages[s].first_layer; l < p.stages[s].end_layer; ++l) {
        if (l < 0 || l >= num_layers) {
          return absl::InvalidArgumentError(absl::StrCat("layer ", l, " outside the model's ",
                                                         num_layers));
        }
        holders[static_cast<size_t>(l)].insert(p.ranks[s]);
      }
    }
  }
  std::vector<GradientSegment> out;
  for (int l = 0; l < num_layers; ++l) {
    if (holders[static_cast<size_t>(l)].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " is held by no rank"));
    }
    std::vector<int> ranks(holders[static_cast<size_t>(l)].begin(),
                           holders[static_cast<size_t>(l)].end());
    if (!out.empty() && out.back().ranks == ranks) {
      out.back().layers.end_layer = l + 1;
    } else {
      out.push_back({{l, l + 1}, ranks});
    }
  }
  return out;
}

}  // namespace tandem::elastic
