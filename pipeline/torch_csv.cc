#include "pipeline/torch_csv.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status.h"
#include "pipeline/generators.h"
#include "pipeline/plan.h"
#include "pipeline/validator.h"

namespace tandem::pipeline {
namespace {

// A file larger than this is not a schedule (p=1024, m=4096 lowered is about 500 MB).
constexpr int64_t kMaxCsvBytes = int64_t{1} << 30;
// Stages and micro-batches a cell may name: what a spec may hold.
constexpr int64_t kMaxCsvStage = kMaxStages;

// torch's _ComputationType, as written in a cell.
enum class TorchType : uint8_t {
  kForward,
  kBackwardInput,
  kBackwardWeight,
  kFullBackward,
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
  kReduceGrad,
  kUnshard,
  kReshard,
  kWaitReduceGrad,
  kWaitSendForward,
  kWaitSendBackward,
};

struct TorchTypeEntry {
  absl::string_view name;
  TorchType type;
  bool has_microbatch;
};

constexpr TorchTypeEntry kTorchTypes[] = {
    {"F", TorchType::kForward, true},
    {"I", TorchType::kBackwardInput, true},
    {"W", TorchType::kBackwardWeight, true},
    {"B", TorchType::kFullBackward, true},
    {"SEND_F", TorchType::kSendForward, true},
    {"RECV_F", TorchType::kRecvForward, true},
    {"SEND_B", TorchType::kSendBackward, true},
    {"RECV_B", TorchType::kRecvBackward, true},
    {"REDUCE_GRAD", TorchType::kReduceGrad, false},
    {"UNSHARD", TorchType::kUnshard, false},
    {"RESHARD", TorchType::kReshard, false},
    {"WAIT_REDUCE_GRAD", TorchType::kWaitReduceGrad, false},
    {"WAIT_SEND_F", TorchType::kWaitSendForward, true},
    {"WAIT_SEND_B", TorchType::kWaitSendBackward, true},
};

bool IsTorchCompute(TorchType type) {
  return type == TorchType::kForward || type == TorchType::kBackwardInput ||
         type == TorchType::kBackwardWeight || type == TorchType::kFullBackward;
}

// One parsed action of a cell (an OVERLAP_F_B cell gives two).
struct TorchAction {
  TorchType type;
  int stage;
  int microbatch;  // -1 where the type has none
};

// Where an error happened: "<file>: rank R, cell C ('text')".
struct CellRef {
  absl::string_view where;
  int rank;
  int cell;
  absl::string_view text;
};

// Text from the file as an error shows it: control and other bytes escaped, so that the error
// stays one printable line whatever the file holds.
std::string Shown(absl::string_view text) { return absl::CHexEscape(text); }

absl::Status CellError(const CellRef& ref, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(ref.where, ": rank ", ref.rank, ", cell ",
                                                 ref.cell + 1, " ('", Shown(ref.text),
                                                 "'): ", message));
}

// Reads a decimal number at the front of *text (consumed); false if there is none or it
// exceeds `limit`.
bool ConsumeNumber(absl::string_view* text, int64_t limit, int64_t* value) {
  size_t n = 0;
  int64_t v = 0;
  while (n < text->size() && absl::ascii_isdigit((*text)[n])) {
    v = v * 10 + ((*text)[n] - '0');
    if (v > limit) return false;
    ++n;
  }
  if (n == 0) return false;
  text->remove_prefix(n);
  *value = v;
  return true;
}

// One "<stage><type>[<micro-batch>]" action.
absl::StatusOr<TorchAction> ParseSimpleAction(absl::string_view text, const CellRef& ref) {
  absl::string_view rest = text;
  int64_t stage = 0;
  if (!ConsumeNumber(&rest, kMaxCsvStage - 1, &stage)) {
    return CellError(ref, absl::StrCat("expected a stage index below ", kMaxCsvStage,
                                       " at the start of '", Shown(text), "'"));
  }
  size_t letters = 0;
  while (letters < rest.size() &&
         (absl::ascii_isupper(rest[letters]) || rest[letters] == '_')) {
    ++letters;
  }
  const absl::string_view name = rest.substr(0, letters);
  rest.remove_prefix(letters);
  const TorchTypeEntry* entry = nullptr;
  for (const TorchTypeEntry& e : kTorchTypes) {
    if (e.name == name) entry = &e;
  }
  if (entry == nullptr) {
    return CellError(ref, absl::StrCat("unknown action type '", Shown(name), "'"));
  }
  TorchAction action{entry->type, static_cast<int>(stage), -1};
  if (entry->has_microbatch) {
    int64_t microbatch = 0;
    if (!ConsumeNumber(&rest, kMaxMicrobatches - 1, &microbatch)) {
      return CellError(ref, absl::StrCat(name, " needs a micro-batch index below ",
                                         kMaxMicrobatches));
    }
    action.microbatch = static_cast<int>(microbatch);
  }
  if (!rest.empty()) {
    return CellError(ref, absl::StrCat("trailing characters '", Shown(rest), "'"));
  }
  return action;
}

// A cell: empty (idle), one action, or "(a;b)OVERLAP_F_B".
absl::Status ParseCell(absl::string_view text, const CellRef& ref,
                       std::vector<TorchAction>* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return absl::OkStatus();
  if (text.front() == '"') {
    return CellError(ref, "quoted cells are not part of the schedule format");
  }
  if (text.front() != '(') {
    TANDEM_ASSIGN_OR_RETURN(TorchAction action, ParseSimpleAction(text, ref));
    out->push_back(action);
    return absl::OkStatus();
  }
  const size_t close = text.find(')');
  if (close == absl::string_view::npos) return CellError(ref, "'(' without ')'");
  if (text.substr(close + 1) != "OVERLAP_F_B") {
    return CellError(ref, absl::StrCat("unknown composite action '",
                                       Shown(text.substr(close + 1)),
                                       "' (expected OVERLAP_F_B)"));
  }
  const size_t before = out->size();
  for (absl::string_view part : absl::StrSplit(text.substr(1, close - 1), ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    TANDEM_ASSIGN_OR_RETURN(TorchAction action, ParseSimpleAction(part, ref));
    if (!IsTorchCompute(action.type)) {
      return CellError(ref, "OVERLAP_F_B holds compute actions only");
    }
    out->push_back(action);
  }
  if (out->size() == before) return CellError(ref, "empty OVERLAP_F_B");
  return absl::OkStatus();
}

// The rows of the file, without their line ends ("\r\n" or "\n"); a last line without an end
// counts, a final empty one does not.
std::vector<absl::string_view> Rows(absl::string_view text) {
  std::vector<absl::string_view> rows = absl::StrSplit(text, '\n');
  if (!rows.empty() && rows.back().empty()) rows.pop_back();
  for (absl::string_view& row : rows) {
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
  }
  return rows;
}

// The placement of a custom schedule whose stage s runs on rank_of[s]: looped or in waves.
absl::StatusOr<ScheduleSpec> CustomSpecFor(const std::vector<int>& rank_of, int num_ranks,
                                           int num_microbatches, absl::string_view where) {
  const int num_stages = static_cast<int>(rank_of.size());
  if (num_stages % num_ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", num_stages, " stages on ", num_ranks,
                     " ranks: every rank must hold the same number of stages"));
  }
  ScheduleSpec spec;
  spec.kind = ScheduleKind::kCustom;
  spec.num_ranks = num_ranks;
  spec.num_microbatches = num_microbatches;
  spec.chunks = num_stages / num_ranks;
  if (spec.chunks > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.chunks,
                                                   " stages per rank; at most ", kMaxChunks));
  }
  for (bool wave : {false, true}) {
    if (wave && spec.chunks % 2 != 0) continue;
    spec.wave_placement = wave;
    const Placement placement = PlacementFor(spec);
    if (placement.stage_to_rank[0] == rank_of) {
      TANDEM_RETURN_IF_ERROR(Annotate(CheckScheduleSpec(spec), where));
      return spec;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": the stages are placed neither looped (stage s on rank s % ", num_ranks,
      ") nor in a V (down the ranks and back up); tandem runs those two placements"));
}

}  // namespace

absl::StatusOr<Schedule> ParseTorchCsvSchedule(absl::string_view text, absl::string_view where) {
  const std::vector<absl::string_view> rows = Rows(text);
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no rows"));
  if (rows.size() > static_cast<size_t>(kMaxRanks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", rows.size(), " rows (ranks); at most ", kMaxRanks));
  }
  const int num_ranks = static_cast<int>(rows.size());
  // Every rank's actions, with the cell each came from (for errors).
  std::vector<std::vector<TorchAction>> actions(num_ranks);
  std::vector<std::vector<int>> cell_of(num_ranks);
  std::vector<int> rank_of;  // per stage; -1 before it is seen
  int num_microbatches = 0;
  bool communication = false;
  for (int r = 0; r < num_ranks; ++r) {
    int cell = 0;
    for (absl::string_view text_cell : absl::StrSplit(rows[r], ',')) {
      const CellRef ref{where, r, cell, text_cell};
      const size_t before = actions[r].size();
      TANDEM_RETURN_IF_ERROR(ParseCell(text_cell, ref, &actions[r]));
      for (size_t k = before; k < actions[r].size(); ++k) {
        const TorchAction& a = actions[r][k];
        cell_of[r].push_back(cell);
        if (!IsTorchCompute(a.type)) {
          communication = true;
          continue;
        }
        if (static_cast<int>(rank_of.size()) <= a.stage) rank_of.resize(a.stage + 1, -1);
        if (rank_of[a.stage] >= 0 && rank_of[a.stage] != r) {
          return CellError(ref, absl::StrCat("stage ", a.stage, " also runs on rank ",
                                             rank_of[a.stage], "; a stage runs on one rank"));
        }
        rank_of[a.stage] = r;
        num_microbatches = std::max(num_microbatches, a.microbatch + 1);
      }
      ++cell;
    }
  }
  if (rank_of.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no compute actions"));
  }
  for (size_t s = 0; s < rank_of.size(); ++s) {
    if (rank_of[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": stage ", s, " never runs (stages 0..", rank_of.size() - 1,
                       " are named)"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec,
                          CustomSpecFor(rank_of, num_ranks, num_microbatches, where));
  Placement placement = PlacementFor(spec);
  const int num_stages = spec.NumStages();

  Schedule schedule;
  if (!communication) {
    // torch's compute-only form: tandem places the transfers.
    std::vector<std::vector<Action>> orders(num_ranks);
    for (int r = 0; r < num_ranks; ++r) {
      for (const TorchAction& a : actions[r]) {
        static constexpr ActionType kCompute[] = {ActionType::kForward,
                                                  ActionType::kBackwardInput,
                                                  ActionType::kBackwardWeight,
                                                  ActionType::kBackward};
        orders[r].emplace_back(kCompute[static_cast<int>(a.type)], a.stage, a.microbatch);
      }
    }
    auto completed = CompleteSchedule(spec, std::move(placement), std::move(orders));
    if (!completed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a valid schedule: ", completed.status().message()));
    }
    schedule = *std::move(completed);
  } else {
    // The lowered form: its transfers and reductions where they stand.
    schedule.spec = spec;
    schedule.placement = std::move(placement);
    schedule.programs.resize(num_ranks);
    std::vector<uint8_t> synced(num_stages, 0);
    for (int r = 0; r < num_ranks; ++r) {
      std::vector<Action>& program = schedule.programs[r];
      for (size_t k = 0; k < actions[r].size(); ++k) {
        const TorchAction& a = actions[r][k];
        const CellRef ref{where, r, cell_of[r][k], ""};
        const int s = a.stage;
        // A transfer of stage `carried`'s data between stage `mine` (on this rank) and its
        // neighbour `other`.
        auto transfer = [&](ActionType type, int carried, int mine, int other) -> absl::Status {
          if (other < 0 || other >= num_stages) {
            return CellError(ref, absl::StrCat("stage ", s, " has no neighbour ", other));
          }
          if (mine >= num_stages || schedule.placement.RankOf(0, mine) != r) {
            return CellError(ref, absl::StrCat("stage ", mine, " does not run on rank ", r));
          }
          const int peer = schedule.placement.RankOf(0, other);
          if (peer == r) {
            return CellError(ref, absl::StrCat("stages ", mine, " and ", other,
                                               " share rank ", r, ": nothing to transfer"));
          }
          program.emplace_back(type, carried, a.microbatch, 0, peer);
          return absl::OkStatus();
        };
        switch (a.type) {
          case TorchType::kForward:
            program.emplace_back(ActionType::kForward, s, a.microbatch);
            break;
          case TorchType::kBackwardInput:
            program.emplace_back(ActionType::kBackwardInput, s, a.microbatch);
            break;
          case TorchType::kBackwardWeight:
            program.emplace_back(ActionType::kBackwardWeight, s, a.microbatch);
            break;
          case TorchType::kFullBackward:
            program.emplace_back(ActionType::kBackward, s, a.microbatch);
            break;
          case TorchType::kSendForward:
            TANDEM_RETURN_IF_ERROR(transfer(ActionType::kSendActivation, s, s, s + 1));
            break;
          case TorchType::kRecvForward:
            TANDEM_RETURN_IF_ERROR(transfer(ActionType::kRecvActivation, s - 1, s, s - 1));
            break;
          case TorchType::kSendBackward:
            TANDEM_RETURN_IF_ERROR(transfer(ActionType::kSendGradient, s, s, s - 1));
            break;
          case TorchType::kRecvBackward:
            TANDEM_RETURN_IF_ERROR(transfer(ActionType::kRecvGradient, s + 1, s, s + 1));
            break;
          case TorchType::kReduceGrad:
            if (s >= num_stages || schedule.placement.RankOf(0, s) != r) {
              return CellError(ref, absl::StrCat("stage ", s, " does not run on rank ", r));
            }
            if (synced[s]) return CellError(ref, "a second REDUCE_GRAD of the stage");
            synced[s] = 1;
            program.emplace_back(ActionType::kGradientSync, s, -1);
            break;
          default:
            break;  // torch's bookkeeping: tandem's runtime does it itself
        }
      }
      // Stages without a REDUCE_GRAD synchronise at the end.
      for (const auto& [replica, stage] : schedule.placement.StagesOf(r)) {
        if (!synced[stage]) program.emplace_back(ActionType::kGradientSync, stage, -1);
      }
      program.emplace_back(ActionType::kOptimizerStep, -1, -1);
    }
  }
  absl::Status valid = ValidateSchedule(schedule);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a valid schedule: ", valid.message()));
  }
  return schedule;
}

absl::StatusOr<Schedule> ReadTorchCsvSchedule(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxCsvBytes));
  return ParseTorchCsvSchedule(text, path);
}

bool TorchCsvHasCommunication(absl::string_view text) {
  return absl::StrContains(text, "SEND_") || absl::StrContains(text, "RECV_") ||
         absl::StrContains(text, "REDUCE_GRAD");
}

namespace {

absl::Status CheckOnePipeline(const Schedule& schedule) {
  if (schedule.placement.NumReplicas() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "torch's CSV format holds one pipeline; ", ScheduleKindName(schedule.spec.kind),
        " runs ", schedule.placement.NumReplicas(), " replicas"));
  }
  return absl::OkStatus();
}

// Appends one rank's row, its line end included.
void AppendTorchCsvRow(std::string& out, const std::vector<Action>& program, bool communication) {
  bool first = true;
  auto cell = [&](int stage, absl::string_view type, int microbatch) {
    if (!first) out += ',';
    first = false;
    absl::StrAppend(&out, stage, type);
    if (microbatch >= 0) absl::StrAppend(&out, microbatch);
  };
  for (const Action& a : program) {
    switch (a.type) {
      case ActionType::kForward:
        cell(a.stage, "F", a.microbatch);
        break;
      case ActionType::kBackwardInput:
        cell(a.stage, "I", a.microbatch);
        break;
      case ActionType::kBackwardWeight:
        cell(a.stage, "W", a.microbatch);
        break;
      case ActionType::kBackward:
        cell(a.stage, "B", a.microbatch);
        break;
      default:
        break;
    }
    if (!communication) continue;
    // torch names a receive by the receiving stage.
    switch (a.type) {
      case ActionType::kSendActivation:
        cell(a.stage, "SEND_F", a.microbatch);
        break;
      case ActionType::kRecvActivation:
        cell(a.stage + 1, "RECV_F", a.microbatch);
        break;
      case ActionType::kSendGradient:
        cell(a.stage, "SEND_B", a.microbatch);
        break;
      case ActionType::kRecvGradient:
        cell(a.stage - 1, "RECV_B", a.microbatch);
        break;
      case ActionType::kGradientSync:
        cell(a.stage, "REDUCE_GRAD", -1);
        break;
      default:
        break;
    }
  }
  out += "\r\n";
}

}  // namespace

absl::StatusOr<std::string> FormatTorchCsvSchedule(const Schedule& schedule, TorchCsvForm form) {
  TANDEM_RETURN_IF_ERROR(CheckOnePipeline(schedule));
  std::string out;
  out.reserve(static_cast<size_t>(schedule.NumActions()) * 6);
  for (const std::vector<Action>& program : schedule.programs) {
    AppendTorchCsvRow(out, program, form == TorchCsvForm::kWithCommunication);
  }
  return out;
}

absl::Status WriteTorchCsvSchedule(const Schedule& schedule, TorchCsvForm form,
                                   AtomicFileWriter& file) {
  TANDEM_RETURN_IF_ERROR(CheckOnePipeline(schedule));
  for (const std::vector<Action>& program : schedule.programs) {
    AppendTorchCsvRow(file.buffer(), program, form == TorchCsvForm::kWithCommunication);
    file.Flush();
  }
  return absl::OkStatus();
}

}  // namespace tandem::pipeline
