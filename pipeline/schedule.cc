#include "pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

struct ActionTypeEntry {
  ActionType type;
  absl::string_view name;
};

// Longer names first so that ParseAction's prefix match finds "Bi" before "B".
constexpr std::array<ActionTypeEntry, 10> kActionTypes = {{
    {ActionType::kGradientSync, "sync"},
    {ActionType::kOptimizerStep, "step"},
    {ActionType::kBackwardInput, "Bi"},
    {ActionType::kSendActivation, "sA"},
    {ActionType::kRecvActivation, "rA"},
    {ActionType::kSendGradient, "sG"},
    {ActionType::kRecvGradient, "rG"},
    {ActionType::kForward, "F"},
    {ActionType::kBackward, "B"},
    {ActionType::kBackwardWeight, "W"},
}};

struct ScheduleKindEntry {
  ScheduleKind kind;
  absl::string_view name;
};

constexpr std::array<ScheduleKindEntry, 10> kScheduleKinds = {{
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::k1F1B, "1f1b"},
    {ScheduleKind::kInterleaved, "interleaved"},
    {ScheduleKind::kChimera, "chimera"},
    {ScheduleKind::kHanayo, "hanayo"},
    {ScheduleKind::kZBH1, "zb-h1"},
    {ScheduleKind::kZBV, "zb-v"},
    {ScheduleKind::kDualPipe, "dualpipe"},
    {ScheduleKind::kDualPipeV, "dualpipev"},
    {ScheduleKind::kCustom, "custom"},
}};

bool IsSend(ActionType type) {
  return type == ActionType::kSendActivation || type == ActionType::kSendGradient;
}

// Reads a non-negative decimal integer at the front of `*text` and consumes it.
bool ConsumeInt(absl::string_view* text, int* value) {
  size_t n = 0;
  while (n < text->size() && absl::ascii_isdigit(static_cast<unsigned char>((*text)[n]))) ++n;
  if (n == 0 || n > 9) return false;
  int parsed = 0;
  if (!absl::SimpleAtoi(text->substr(0, n), &parsed)) return false;
  *value = parsed;
  text->remove_prefix(n);
  return true;
}

absl::Status RangeError(absl::string_view field, int64_t low, int64_t high, int64_t got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be in [", low, ", ", high, "], got ", got));
}

}  // namespace

absl::string_view ActionTypeName(ActionType type) {
  for (const auto& entry : kActionTypes) {
    if (entry.type == type) return entry.name;
  }
  return "?";
}

absl::StatusOr<ActionType> ParseActionType(absl::string_view name) {
  for (const auto& entry : kActionTypes) {
    if (entry.name == name) return entry.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown action type '", name, "'"));
}

bool IsCompute(ActionType type) {
  return type == ActionType::kForward || type == ActionType::kBackward ||
         type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight;
}

bool IsTransfer(ActionType type) {
  return type == ActionType::kSendActivation || type == ActionType::kRecvActivation ||
         type == ActionType::kSendGradient || type == ActionType::kRecvGradient;
}

void AppendAction(std::string* out, const Action& action) {
  if (action.type == ActionType::kOptimizerStep) {
    out->append("step");
    return;
  }
  absl::StrAppend(out, ActionTypeName(action.type), action.stage);
  if (action.type != ActionType::kGradientSync) absl::StrAppend(out, ".", action.microbatch);
  if (action.replica != 0) absl::StrAppend(out, "r", action.replica);
  if (IsTransfer(action.type)) absl::StrAppend(out, IsSend(action.type) ? ">" : "<", action.peer);
}

std::string ToString(const Action& action) {
  std::string out;
  AppendAction(&out, action);
  return out;
}

absl::StatusOr<Action> ParseAction(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad action '", text, "': ", why));
  };
  absl::string_view rest = text;
  Action action;
  bool found = false;
  for (const auto& entry : kActionTypes) {
    if (absl::StartsWith(rest, entry.name)) {
      action.type = entry.type;
      rest.remove_prefix(entry.name.size());
      found = true;
      break;
    }
  }
  if (!found) return bad("unknown action type");
  if (action.type == ActionType::kOptimizerStep) {
    if (!rest.empty()) return bad("trailing characters");
    action.stage = -1;
    action.microbatch = -1;
    return action;
  }
  int stage = 0;
  if (!ConsumeInt(&rest, &stage)) return bad("expected a stage number");
  if (stage < 0 || stage >= kMaxStages) {
    return bad(absl::StrCat("stage out of range [0, ", kMaxStages, ")"));
  }
  action.stage = static_cast<int16_t>(stage);
  if (action.type == ActionType::kGradientSync) {
    action.microbatch = -1;
  } else {
    if (!absl::ConsumePrefix(&rest, ".")) return bad("expected '.' and a micro-batch");
    int microbatch = 0;
    if (!ConsumeInt(&rest, &microbatch)) return bad("expected a micro-batch number");
    if (microbatch < 0 || microbatch >= kMaxMicrobatches) {
      return bad(absl::StrCat("micro-batch out of range [0, ", kMaxMicrobatches, ")"));
    }
    action.microbatch = static_cast<int16_t>(microbatch);
  }
  if (absl::ConsumePrefix(&rest, "r")) {
    int replica = 0;
    if (!ConsumeInt(&rest, &replica)) return bad("expected a replica number");
    if (replica < 0 || replica >= kMaxReplicas) {
      return bad(absl::StrCat("replica out of range [0, ", kMaxReplicas, ")"));
    }
    action.replica = static_cast<uint8_t>(replica);
  }
  if (IsTransfer(action.type)) {
    if (!absl::ConsumePrefix(&rest, IsSend(action.type) ? ">" : "<")) {
      return bad(IsSend(action.type) ? "expected '>' and a peer rank"
                                     : "expected '<' and a peer rank");
    }
    int peer = 0;
    if (!ConsumeInt(&rest, &peer)) return bad("expected a peer rank");
    if (peer < 0 || peer >= kMaxRanks) {
      return bad(absl::StrCat("peer rank out of range [0, ", kMaxRanks, ")"));
    }
    action.peer = static_cast<int16_t>(peer);
  }
  if (!rest.empty()) return bad("trailing characters");
  return action;
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  for (const auto& entry : kScheduleKinds) {
    if (entry.kind == kind) return entry.name;
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  for (const auto& entry : kScheduleKinds) {
    if (entry.name == lower) return entry.kind;
  }
  // Common spellings.
  if (lower == "zbh1" || lower == "zb_h1") return ScheduleKind::kZBH1;
  if (lower == "zbv" || lower == "zb_v") return ScheduleKind::kZBV;
  if (lower == "pipedream-flush") return ScheduleKind::k1F1B;
  if (lower == "dualpipe-v" || lower == "dualpipe_v") return ScheduleKind::kDualPipeV;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "' (expected one of ", ScheduleKindList(), ")"));
}

std::string ScheduleKindList() {
  std::vector<absl::string_view> names;
  for (const auto& entry : kScheduleKinds) {
    if (entry.kind != ScheduleKind::kCustom) names.push_back(entry.name);
  }
  return absl::StrJoin(names, ", ");
}

int ScheduleSpec::ChunksPerRank() const {
  switch (kind) {
    case ScheduleKind::kInterleaved:
      return chunks;
    case ScheduleKind::kHanayo:
      return 2 * waves;
    case ScheduleKind::kZBV:
    case ScheduleKind::kDualPipeV:
      return 2;
    case ScheduleKind::kCustom:
      return chunks;
    default:
      return 1;
  }
}

int ScheduleSpec::NumStages() const { return num_ranks * ChunksPerRank(); }

int ScheduleSpec::NumReplicas() const {
  return kind == ScheduleKind::kChimera || kind == ScheduleKind::kDualPipe ? 2 : 1;
}

bool ScheduleSpec::SplitsBackward() const {
  switch (kind) {
    case ScheduleKind::kZBH1:
    case ScheduleKind::kZBV:
    case ScheduleKind::kDualPipe:
    case ScheduleKind::kDualPipeV:
    case ScheduleKind::kCustom:
      return true;
    default:
      return false;
  }
}

absl::Status CheckScheduleSpec(const ScheduleSpec& spec) {
  if (spec.num_ranks < 1 || spec.num_ranks > kMaxRanks) {
    return RangeError("stages (ranks)", 1, kMaxRanks, spec.num_ranks);
  }
  if (spec.num_microbatches < 1 || spec.num_microbatches > kMaxMicrobatches) {
    return RangeError("microbatches", 1, kMaxMicrobatches, spec.num_microbatches);
  }
  if (spec.chunks < 1 || spec.chunks > kMaxChunks) {
    return RangeError("chunks", 1, kMaxChunks, spec.chunks);
  }
  if (spec.waves < 1 || spec.waves > kMaxWaves) {
    return RangeError("waves", 1, kMaxWaves, spec.waves);
  }
  if (spec.NumStages() > kMaxStages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule too large: ", spec.num_ranks, " ranks x ", spec.ChunksPerRank(),
        " chunks per rank is ", spec.NumStages(), " stages (at most ", kMaxStages, ")"));
  }
  const auto& costs = spec.planning_costs;
  if (costs != std::array<int, 3>{}) {
    for (int c : costs) {
      if (c < 1 || c > kMaxPlanningCost) return RangeError("planning costs", 1, kMaxPlanningCost, c);
    }
    if (spec.kind != ScheduleKind::kZBV) {
      return absl::InvalidArgumentError(absl::StrCat(
          "planning costs are for zb-v only (", ScheduleKindName(spec.kind), " has a fixed order)"));
    }
  }
  if (spec.wave_placement) {
    if (spec.kind != ScheduleKind::kCustom) {
      return absl::InvalidArgumentError(
          absl::StrCat("wave_placement is for custom schedules only (",
                       ScheduleKindName(spec.kind), " has a fixed placement)"));
    }
    if (spec.chunks % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a custom schedule in waves needs an even number of chunks, got ", spec.chunks));
    }
  }
  // Chimera splits its micro-batches between the replicas, so each is counted once.
  int64_t triples = int64_t{spec.NumStages()} * spec.num_microbatches;
  if (triples > kMaxStageMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule too large: ", spec.NumStages(), " stages x ", spec.num_microbatches,
        " micro-batches exceeds ", kMaxStageMicrobatches, " stage micro-batches"));
  }
  return absl::OkStatus();
}

std::vector<std::pair<int, int>> Placement::StagesOf(int rank) const {
  std::vector<std::pair<int, int>> out;
  for (int replica = 0; replica < NumReplicas(); ++replica) {
    const std::vector<int>& ranks = stage_to_rank[replica];
    for (int stage = 0; stage < static_cast<int>(ranks.size()); ++stage) {
      if (ranks[stage] == rank) out.emplace_back(replica, stage);
    }
  }
  return out;
}

Placement Placement::Linear(int num_ranks) { return Looped(num_ranks, /*chunks=*/1); }

Placement Placement::Looped(int num_ranks, int chunks) {
  Placement placement;
  placement.num_ranks = num_ranks;
  placement.num_stages = num_ranks * chunks;
  std::vector<int> ranks(placement.num_stages);
  for (int stage = 0; stage < placement.num_stages; ++stage) ranks[stage] = stage % num_ranks;
  placement.stage_to_rank.push_back(std::move(ranks));
  return placement;
}

Placement Placement::Wave(int num_ranks, int waves) {
  Placement placement;
  placement.num_ranks = num_ranks;
  placement.num_stages = 2 * waves * num_ranks;
  std::vector<int> ranks(placement.num_stages);
  for (int stage = 0; stage < placement.num_stages; ++stage) {
    int half = stage / num_ranks;
    int offset = stage % num_ranks;
    ranks[stage] = half % 2 == 0 ? offset : num_ranks - 1 - offset;
  }
  placement.stage_to_rank.push_back(std::move(ranks));
  return placement;
}

Placement Placement::Bidirectional(int num_ranks) {
  Placement placement = Linear(num_ranks);
  std::vector<int> reversed(num_ranks);
  for (int stage = 0; stage < num_ranks; ++stage) reversed[stage] = num_ranks - 1 - stage;
  placement.stage_to_rank.push_back(std::move(reversed));
  return placement;
}

int64_t Schedule::NumActions() const {
  int64_t total = 0;
  for (const auto& program : programs) total += static_cast<int64_t>(program.size());
  return total;
}

std::string FormatGrid(const Schedule& schedule, bool with_transfers) {
  GridOptions options;
  options.with_transfers = with_transfers;
  return FormatGrid(schedule, options);
}

std::string FormatGrid(const Schedule& schedule, const GridOptions& options) {
  const int num_ranks = schedule.NumRanks();
  const int shown_ranks =
      options.max_ranks > 0 ? std::min(options.max_ranks, num_ranks) : num_ranks;
  // Cells first, so that columns can be padded to a common width.
  std::vector<std::vector<std::string>> cells(shown_ranks);
  std::vector<int64_t> hidden(shown_ranks, 0);
  size_t width = 1;
  for (int rank = 0; rank < shown_ranks; ++rank) {
    for (const Action& action : schedule.programs[rank]) {
      if (!options.with_transfers && !IsCompute(action.type)) continue;
      if (options.max_columns > 0 && static_cast<int>(cells[rank].size()) >= options.max_columns) {
        ++hidden[rank];
        continue;
      }
      cells[rank].push_back(ToString(action));
      width = std::max(width, cells[rank].back().size());
    }
  }
  const std::string rank_label_width = std::to_string(std::max(0, num_ranks - 1));
  std::string out;
  for (int rank = 0; rank < shown_ranks; ++rank) {
    std::string label = std::to_string(rank);
    absl::StrAppend(&out, "rank ", std::string(rank_label_width.size() - label.size(), ' '),
                    label, " |");
    for (const std::string& cell : cells[rank]) {
      absl::StrAppend(&out, " ", cell, std::string(width - cell.size(), ' '));
    }
    if (rank < static_cast<int>(options.cells_not_given.size())) {
      hidden[rank] += options.cells_not_given[rank];
    }
    if (hidden[rank] > 0) absl::StrAppend(&out, " ... (+", hidden[rank], ")");
    // No trailing blanks.
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out.push_back('\n');
  }
  if (shown_ranks < num_ranks) {
    absl::StrAppend(&out, "... ", num_ranks - shown_ranks, " more ranks not shown\n");
  }
  return out;
}

absl::StatusOr<std::array<double, 3>> ParsePlanningCosts(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  std::array<double, 3> costs{};
  bool ok = parts.size() == 3;
  for (size_t k = 0; ok && k < 3; ++k) {
    ok = absl::SimpleAtod(parts[k], &costs[k]) && std::isfinite(costs[k]) && costs[k] > 0;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "planning costs '", text, "': expected three positive numbers F,Bi,W"));
  }
  return costs;
}

std::array<int, 3> PlanningCostTicks(const std::array<double, 3>& costs) {
  const double most = std::max({costs[0], costs[1], costs[2]});
  std::array<int, 3> ticks{};
  if (!(most > 0) || !std::isfinite(most)) return ticks;
  for (size_t k = 0; k < 3; ++k) {
    const double share = std::max(0.0, costs[k]) / most;
    ticks[k] = std::max(1, static_cast<int>(std::lround(100.0 * share)));
  }
  return ticks;
}

nlohmann::json ToJson(const ScheduleSpec& spec) {
  nlohmann::json j = {{"name", std::string(ScheduleKindName(spec.kind))},
                      {"num_ranks", spec.num_ranks},
                      {"num_microbatches", spec.num_microbatches},
                      {"chunks", spec.chunks},
                      {"waves", spec.waves}};
  if (spec.planning_costs != std::array<int, 3>{}) j["planning_costs"] = spec.planning_costs;
  if (spec.wave_placement) j["wave_placement"] = true;
  return j;
}

absl::StatusOr<ScheduleSpec> ScheduleSpecFromJson(const nlohmann::json& j,
                                                  absl::string_view where) {
  ScheduleSpec spec;
  TANDEM_ASSIGN_OR_RETURN(std::string name, GetString(j, "name", where));
  auto kind = ParseScheduleKind(name);
  if (!kind.ok()) return Annotate(kind.status(), absl::StrCat(where, ".name"));
  spec.kind = *kind;
  TANDEM_ASSIGN_OR_RETURN(int64_t ranks, GetInt(j, "num_ranks", where));
  TANDEM_ASSIGN_OR_RETURN(int64_t microbatches, GetInt(j, "num_microbatches", where));
  TANDEM_ASSIGN_OR_RETURN(int64_t chunks, GetIntOr(j, "chunks", 1, where));
  TANDEM_ASSIGN_OR_RETURN(int64_t waves, GetIntOr(j, "waves", 1, where));
  // Clamp before narrowing so that absurd values still give a range error.
  auto narrow = [](int64_t v) {
    return static_cast<int>(std::clamp<int64_t>(v, -1, int64_t{1} << 30));
  };
  spec.num_ranks = narrow(ranks);
  spec.num_microbatches = narrow(microbatches);
  spec.chunks = narrow(chunks);
  spec.waves = narrow(waves);
  if (j.contains("planning_costs")) {
    const nlohmann::json& costs = j["planning_costs"];
    if (!costs.is_array() || costs.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".planning_costs: expected 3 numbers (forward, input gradient, weight gradient)"));
    }
    for (size_t k = 0; k < 3; ++k) {
      if (!costs[k].is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".planning_costs[", k, "]: expected an integer"));
      }
      spec.planning_costs[k] = narrow(costs[k].get<int64_t>());
    }
  }
  if (j.contains("wave_placement")) {
    TANDEM_ASSIGN_OR_RETURN(spec.wave_placement, GetBool(j, "wave_placement", where));
  }
  TANDEM_RETURN_IF_ERROR(Annotate(CheckScheduleSpec(spec), where));
  return spec;
}

nlohmann::json ToJson(const Placement& placement) {
  return {{"num_ranks", placement.num_ranks},
          {"num_stages", placement.num_stages},
          {"stage_to_rank", placement.stage_to_rank}};
}

absl::StatusOr<Placement> PlacementFromJson(const nlohmann::json& j, absl::string_view where) {
  Placement placement;
  TANDEM_ASSIGN_OR_RETURN(int64_t ranks, GetInt(j, "num_ranks", where));
  TANDEM_ASSIGN_OR_RETURN(int64_t stages, GetInt(j, "num_stages", where));
  if (ranks < 1 || ranks > kMaxRanks) {
    return Annotate(RangeError("num_ranks", 1, kMaxRanks, ranks), where);
  }
  const int64_t max_stages = kMaxStages;
  if (stages < 1 || stages > max_stages) {
    return Annotate(RangeError("num_stages", 1, max_stages, stages), where);
  }
  placement.num_ranks = static_cast<int>(ranks);
  placement.num_stages = static_cast<int>(stages);
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* replicas, GetArray(j, "stage_to_rank", where));
  if (replicas->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".stage_to_rank: expected at least one replica"));
  }
  for (size_t replica = 0; replica < replicas->size(); ++replica) {
    const nlohmann::json& row = (*replicas)[replica];
    std::string row_where = absl::StrCat(where, ".stage_to_rank[", replica, "]");
    if (!row.is_array() || static_cast<int64_t>(row.size()) != stages) {
      return absl::InvalidArgumentError(
          absl::StrCat(row_where, ": expected an array of ", stages, " ranks"));
    }
    std::vector<int> rank_of(row.size());
    for (size_t stage = 0; stage < row.size(); ++stage) {
      const nlohmann::json& value = row[stage];
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() >= ranks) {
        return absl::InvalidArgumentError(absl::StrCat(
            row_where, "[", stage, "]: expected a rank in [0, ", ranks - 1, "], got ",
            value.dump()));
      }
      rank_of[stage] = value.get<int>();
    }
    placement.stage_to_rank.push_back(std::move(rank_of));
  }
  return placement;
}

nlohmann::json ToJson(const Schedule& schedule) {
  nlohmann::json programs = nlohmann::json::array();
  for (const auto& program : schedule.programs) {
    nlohmann::json actions = nlohmann::json::array();
    for (const Action& action : program) actions.push_back(ToString(action));
    programs.push_back(std::move(actions));
  }
  return {{"spec", ToJson(schedule.spec)},
          {"placement", ToJson(schedule.placement)},
          {"programs", std::move(programs)}};
}

void WriteScheduleJson(const Schedule& schedule, AtomicFileWriter& file) {
  // nlohmann::json writes an object's keys in order: placement, programs, spec. An action's
  // text has nothing JSON escapes.
  file.Append(absl::StrCat("{\"placement\":", ToJson(schedule.placement).dump(),
                           ",\"programs\":["));
  std::string& out = file.buffer();
  for (size_t r = 0; r < schedule.programs.size(); ++r) {
    out += r == 0 ? "[" : ",[";
    bool first = true;
    for (const Action& action : schedule.programs[r]) {
      out += first ? "\"" : ",\"";
      first = false;
      AppendAction(&out, action);
      out += '"';
      file.Flush();
    }
    out += ']';
  }
  file.Append(absl::StrCat("],\"spec\":", ToJson(schedule.spec).dump(), "}"));
}

absl::StatusOr<Schedule> ScheduleFromJson(const nlohmann::json& j, absl::string_view where) {
  Schedule schedule;
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* spec_json, GetObject(j, "spec", where));
  TANDEM_ASSIGN_OR_RETURN(schedule.spec,
                          ScheduleSpecFromJson(*spec_json, absl::StrCat(where, ".spec")));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* placement_json, GetObject(j, "placement", where));
  TANDEM_ASSIGN_OR_RETURN(schedule.placement,
                          PlacementFromJson(*placement_json, absl::StrCat(where, ".placement")));
  const ScheduleSpec& spec = schedule.spec;
  const Placement& placement = schedule.placement;
  if (placement.num_ranks != spec.num_ranks || placement.num_stages != spec.NumStages() ||
      placement.NumReplicas() != spec.NumReplicas()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".placement: ", placement.num_ranks, " ranks, ", placement.num_stages,
        " stages, ", placement.NumReplicas(), " replicas does not match the spec's ",
        spec.num_ranks, ", ", spec.NumStages(), ", ", spec.NumReplicas()));
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* programs, GetArray(j, "programs", where));
  if (static_cast<int>(programs->size()) != spec.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".programs: expected ", spec.num_ranks,
                                                   " programs, got ", programs->size()));
  }
  for (size_t rank = 0; rank < programs->size(); ++rank) {
    const nlohmann::json& program = (*programs)[rank];
    std::string rank_where = absl::StrCat(where, ".programs[", rank, "]");
    if (!program.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(rank_where, ": expected an array"));
    }
    std::vector<Action> actions;
    actions.reserve(program.size());
    for (size_t step = 0; step < program.size(); ++step) {
      std::string step_where = absl::StrCat(rank_where, "[", step, "]");
      if (!program[step].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(step_where, ": expected a string"));
      }
      auto action = ParseAction(program[step].get<std::string>());
      if (!action.ok()) return Annotate(action.status(), step_where);
      const Action& a = *action;
      bool stage_ok = a.type == ActionType::kOptimizerStep
                          ? true
                          : a.stage >= 0 && a.stage < placement.num_stages;
      bool microbatch_ok = a.type == ActionType::kOptimizerStep ||
                           a.type == ActionType::kGradientSync ||
                           a.microbatch < spec.num_microbatches;
      bool replica_ok = a.replica < placement.NumReplicas();
      bool peer_ok = !IsTransfer(a.type) || a.peer < placement.num_ranks;
      if (!stage_ok || !microbatch_ok || !replica_ok || !peer_ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            step_where, ": '", ToString(a), "' out of range: ",
            !stage_ok ? "stage" : !microbatch_ok ? "micro-batch" : !replica_ok ? "replica"
                                                                                  : "peer rank"));
      }
      actions.push_back(a);
    }
    schedule.programs.push_back(std::move(actions));
  }
  return schedule;
}

uint64_t ScheduleDigest(const Schedule& schedule) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](int64_t value) {
    for (int k = 0; k < 8; ++k) {
      h ^= static_cast<uint64_t>(value >> (8 * k)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& row : schedule.placement.stage_to_rank) {
    for (int rank : row) mix(rank);
    mix(-1);
  }
  for (const auto& program : schedule.programs) {
    mix(static_cast<int64_t>(program.size()));
    for (const Action& a : program) {
      mix(static_cast<int64_t>(a.type));
      mix(a.stage);
      mix(a.microbatch);
      mix(a.replica);
      mix(a.peer);
    }
  }
  return h;
}

}  // namespace tandem::pipeline
