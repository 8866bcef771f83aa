// `tandem schedule`: generate a pipeline schedule, prove it correct, simulate it and print the
// per-rank grid and statistics (or JSON), optionally writing a Chrome trace, an SVG Gantt chart
// and the schedule itself.
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/gantt.h"
#include "pipeline/generators.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "pipeline/streamed.h"
#include "pipeline/torch_csv.h"
#include "pipeline/validator.h"

ABSL_FLAG(double, forward, 1.0,
          "forward time of one stage (1/p of the model) for one micro-batch, seconds; a chunk "
          "takes its share");
ABSL_FLAG(double, backward, 2.0,
          "backward time of one stage for one micro-batch, seconds (the input-gradient part "
          "when --weight is given)");
ABSL_FLAG(double, weight, 0.0,
          "weight-gradient time of one stage, seconds; schedules that do not split backward "
          "run it with --backward; without it, zb-h1 and zb-v split --backward in halves");
ABSL_FLAG(std::string, costs, "",
          "JSON file with per-stage costs (one per stage of the pipeline: p, p*v interleaved, "
          "2*W*p hanayo, 2*p zb-v): {\"forward\": [...], \"backward\": [...], optional "
          "\"weight\", \"activation_bytes\", \"stash_units\", \"grad_sync_seconds\" arrays and "
          "\"latency_seconds\", \"bandwidth_bytes_per_second\", \"optimizer_seconds\"}; "
          "replaces --forward/--backward/--weight");
ABSL_FLAG(double, latency, 0.0, "point-to-point latency between ranks, seconds");
ABSL_FLAG(std::string, activation_bytes, "0",
          "bytes of one stage's output activation for one micro-batch (e.g. 16MiB); with "
          "--bandwidth gives the transfer time");
ABSL_FLAG(std::string, svg, "", "write an SVG Gantt chart of the simulated timeline here");
ABSL_FLAG(bool, transfers, false, "show transfers and synchronisation in the grid too");
ABSL_FLAG(std::string, from_csv, "",
          "read the schedule from this CSV file in torch.distributed.pipelining's format (one "
          "row per rank: 0F0, 1I2, 1W2, 0B1, ...; compute only or lowered with SEND_F/RECV_F/"
          "SEND_B/RECV_B) instead of generating one with --schedule");
ABSL_FLAG(std::string, to_csv, "",
          "write the schedule to this file in torch.distributed.pipelining's CSV format");
ABSL_FLAG(bool, csv_transfers, false,
          "--to-csv writes the lowered form, with the transfers and REDUCE_GRAD (default: the "
          "form --from-csv read, else compute only)");

namespace tandem::cli {
namespace {

using pipeline::CostModel;
using pipeline::GridOptions;
using pipeline::Schedule;
using pipeline::ScheduleSpec;
using pipeline::SimulationOptions;
using pipeline::SimulationResult;

// A trace larger than this gets a note on what opens it.
constexpr int64_t kLargeTraceBytes = int64_t{1} << 30;

// Beyond this many actions the grid is truncated.
constexpr int64_t kFullGridActions = 4000;
constexpr int kTruncatedRanks = 16;
constexpr int kTruncatedColumns = 40;

absl::Status CheckTime(double value, absl::string_view flag) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a finite non-negative number of seconds, got ",
                     value));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScheduleSpec> SpecFromFlags() {
  const std::string name = absl::GetFlag(FLAGS_schedule);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing --schedule (one of ", pipeline::ScheduleKindList(), ")"));
  }
  ScheduleSpec spec;
  TANDEM_ASSIGN_OR_RETURN(spec.kind, pipeline::ParseScheduleKind(name));
  spec.num_ranks = absl::GetFlag(FLAGS_stages);
  spec.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  spec.chunks = absl::GetFlag(FLAGS_chunks);
  spec.waves = absl::GetFlag(FLAGS_waves);
  const std::string planning = absl::GetFlag(FLAGS_planning_costs);
  if (!planning.empty()) {
    TANDEM_ASSIGN_OR_RETURN(const auto costs, pipeline::ParsePlanningCosts(planning));
    spec.planning_costs = pipeline::PlanningCostTicks(costs);
  }
  return spec;
}

absl::StatusOr<CostModel> CostsFromFlags(const ScheduleSpec& spec) {
  CostModel costs;
  const std::string path = absl::GetFlag(FLAGS_costs);
  // A cost file gives every stage's times and bytes: these flags would be ignored beside it.
  for (const char* flag : {"forward", "backward", "weight", "activation_bytes"}) {
    if (!path.empty() && FlagGivenOnCommandLine(flag)) {
      const std::string name = CommandLineFlag(flag);
      return absl::InvalidArgumentError(
          absl::StrCat(name, " and --costs ", path, " both give the stages' costs: the file's "
                       "are used, so leave ", name, " out (or edit the file)"));
    }
  }
  if (!path.empty()) {
    TANDEM_ASSIGN_OR_RETURN(Json j, ReadJsonFile(path));
    TANDEM_ASSIGN_OR_RETURN(costs, CostModel::FromJson(j, spec, path));
  } else {
    const double forward = absl::GetFlag(FLAGS_forward);
    const double backward = absl::GetFlag(FLAGS_backward);
    const double weight = absl::GetFlag(FLAGS_weight);
    TANDEM_RETURN_IF_ERROR(CheckTime(forward, "forward"));
    TANDEM_RETURN_IF_ERROR(CheckTime(backward, "backward"));
    TANDEM_RETURN_IF_ERROR(CheckTime(weight, "weight"));
    costs = CostModel::Uniform(spec, forward, backward, weight);
    auto bytes = ParseBytes(absl::GetFlag(FLAGS_activation_bytes));
    if (!bytes.ok()) return Annotate(bytes.status(), "--activation-bytes");
    for (auto& stage : costs.stages) stage.activation_bytes = *bytes;
  }
  // Flags given explicitly add to (or override) what a cost file says.
  const double latency = absl::GetFlag(FLAGS_latency);
  TANDEM_RETURN_IF_ERROR(CheckTime(latency, "latency"));
  if (latency > 0) costs.p2p_latency_seconds = latency;
  const std::vector<std::string> bandwidth = absl::GetFlag(FLAGS_bandwidth);
  if (bandwidth.size() > 1) {
    return absl::InvalidArgumentError("--bandwidth: give one value (between pipeline ranks)");
  }
  if (!bandwidth.empty()) {
    auto rate = ParseBytesPerSecond(bandwidth[0]);
    if (!rate.ok()) return Annotate(rate.status(), "--bandwidth");
    if (*rate <= 0) return absl::InvalidArgumentError("--bandwidth must be positive");
    costs.p2p_bandwidth_bytes_per_second = *rate;
  }
  // Transfer time is bytes / bandwidth: one without the other changes nothing.
  bool any_bytes = false;
  for (const auto& stage : costs.stages) any_bytes = any_bytes || stage.activation_bytes > 0;
  if (!bandwidth.empty() && !any_bytes) {
    return absl::InvalidArgumentError(
        "--bandwidth times transfers of --activation-bytes (or a cost file's activation_bytes), "
        "and there are none: give --activation-bytes too");
  }
  if (FlagGivenOnCommandLine("activation_bytes") && any_bytes &&
      !(costs.p2p_bandwidth_bytes_per_second > 0)) {
    return absl::InvalidArgumentError(
        "--activation-bytes needs a --bandwidth (or a cost file's bandwidth_bytes_per_second) "
        "to take time; without one transfers are instantaneous");
  }
  return costs;
}

std::string FormatNumber(double value) { return absl::StrFormat("%.6g", value); }

// The text report. `schedule` holds the programs the grid is drawn from: whole, or (streamed)
// the kept start of the first ranks' programs with `cells_not_given` counting the rest.
std::string TextReport(const Schedule& schedule, int64_t num_actions,
                       const SimulationResult& result, bool grouped_ok,
                       std::vector<int64_t> cells_not_given = {}) {
  const ScheduleSpec& spec = schedule.spec;
  std::string out = absl::StrFormat(
      "schedule %s: %d ranks, %d micro-batches, %d stages%s, %d actions; valid (grouped "
      "rendezvous: %s)\n\n",
      pipeline::ScheduleKindName(spec.kind), spec.num_ranks, spec.num_microbatches,
      spec.NumStages(), spec.NumReplicas() > 1 ? " x 2 replicas" : "", num_actions,
      grouped_ok ? "valid" : "not valid");
  GridOptions grid;
  grid.with_transfers = absl::GetFlag(FLAGS_transfers);
  grid.cells_not_given = std::move(cells_not_given);
  const bool truncate = num_actions > kFullGridActions;
  if (truncate) {
    grid.max_ranks = kTruncatedRanks;
    grid.max_columns = kTruncatedColumns;
  }
  absl::StrAppend(&out, pipeline::FormatGrid(schedule, grid));
  if (truncate) {
    absl::StrAppend(&out, "(grid truncated to ", kTruncatedRanks, " ranks and ",
                    kTruncatedColumns, " actions per rank; --format json for all figures)\n");
  }
  absl::StrAppendFormat(&out, "\nmakespan       %s s\nbubble ratio   %.6f\n\n",
                        FormatNumber(result.makespan_seconds), result.bubble_ratio);
  absl::StrAppend(&out, "rank  busy (s)      idle (s)      peak activations (stage units)\n");
  const int num_ranks = schedule.NumRanks();
  const int shown = truncate ? std::min(num_ranks, kTruncatedRanks) : num_ranks;
  for (int r = 0; r < shown; ++r) {
    absl::StrAppendFormat(&out, "%-5d %-13s %-13s %s\n", r,
                          FormatNumber(result.busy_seconds[r]),
                          FormatNumber(result.idle_seconds[r]),
                          FormatNumber(result.peak_activations[r]));
  }
  if (shown < num_ranks) absl::StrAppend(&out, "... ", num_ranks - shown, " more ranks\n");
  return out;
}

Json JsonReport(const ScheduleSpec& spec, int64_t num_actions, const SimulationResult& result,
                bool grouped_ok) {
  return {{"schedule", pipeline::ToJson(spec)},
          {"num_stages", spec.NumStages()},
          {"num_actions", num_actions},
          {"valid", true},
          {"valid_grouped_rendezvous", grouped_ok},
          {"makespan", result.makespan_seconds},
          {"bubble_ratio", result.bubble_ratio},
          {"busy", result.busy_seconds},
          {"idle", result.idle_seconds},
          {"peak_activations", result.peak_activations}};
}

absl::Status Run(int* exit_code) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", format, "'"));
  }
  const std::string from_csv = absl::GetFlag(FLAGS_from_csv);
  const std::string to_csv = absl::GetFlag(FLAGS_to_csv);
  bool csv_transfers = absl::GetFlag(FLAGS_csv_transfers);
  if (csv_transfers && to_csv.empty()) {
    return absl::InvalidArgumentError("--csv-transfers applies to --to-csv FILE; there is none");
  }
  if (!to_csv.empty()) TANDEM_RETURN_IF_ERROR(CheckOutputFile(to_csv, "--to-csv"));
  const std::string trace_path = absl::GetFlag(FLAGS_trace);
  const std::string svg_path = absl::GetFlag(FLAGS_svg);
  const std::string output_path = absl::GetFlag(FLAGS_output);
  if (from_csv.empty() && to_csv.empty() && trace_path.empty() && svg_path.empty() &&
      output_path.empty()) {
    // Statistics alone: the list-scheduled kinds are validated and simulated while they are
    // generated, never held whole (pipeline/streamed.h); the others take the path below. The
    // text report's grid needs every program of a small schedule (it is drawn whole up to
    // kFullGridActions), and of a large one only the start of the first ranks': a schedule
    // streams for it when its computes alone (two per stage and micro-batch at least) are
    // past that.
    TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec, SpecFromFlags());
    const bool text = format == "text";
    const bool large = int64_t{2} * spec.NumStages() * spec.num_microbatches > kFullGridActions;
    if (!text || large) {
      pipeline::StreamOptions options;
      if (text) {
        options.kept_ranks = kTruncatedRanks;
        options.kept_cells = kTruncatedColumns;
        options.kept_transfers = absl::GetFlag(FLAGS_transfers);
      }
      TANDEM_ASSIGN_OR_RETURN(std::optional<pipeline::StreamedSchedule> streamed,
                              pipeline::GenerateAndSimulateStreamed(spec, CostsFromFlags, options));
      if (streamed) {
        if (text) {
          std::cout << TextReport(streamed->kept, streamed->num_actions, streamed->simulation,
                                  streamed->valid_grouped_rendezvous,
                                  std::move(streamed->cells_not_kept));
        } else {
          std::cout << JsonReport(streamed->spec, streamed->num_actions, streamed->simulation,
                                  streamed->valid_grouped_rendezvous)
                           .dump(2)
                    << "\n";
        }
        *exit_code = kExitOk;
        return absl::OkStatus();
      }
    }
  }
  Schedule schedule;
  if (!from_csv.empty()) {
    if (!absl::GetFlag(FLAGS_schedule).empty()) {
      return absl::InvalidArgumentError("give --schedule or --from-csv, not both");
    }
    if (absl::GetFlag(FLAGS_stages) != 0 || absl::GetFlag(FLAGS_microbatches) != 0 ||
        absl::GetFlag(FLAGS_chunks) != 1 || absl::GetFlag(FLAGS_waves) != 1 ||
        !absl::GetFlag(FLAGS_planning_costs).empty()) {
      return absl::InvalidArgumentError(
          "--from-csv: the ranks, stages and micro-batches come from the file (drop --stages, "
          "--microbatches, --chunks, --waves and --planning-costs)");
    }
    // Read first so that a bad file is reported as such; the reader validates.
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(from_csv, int64_t{1} << 30));
    TANDEM_ASSIGN_OR_RETURN(schedule, pipeline::ParseTorchCsvSchedule(text, from_csv));
    csv_transfers = csv_transfers || pipeline::TorchCsvHasCommunication(text);
  } else {
    TANDEM_ASSIGN_OR_RETURN(ScheduleSpec spec, SpecFromFlags());
    TANDEM_ASSIGN_OR_RETURN(schedule, pipeline::GenerateSchedule(spec));
  }
  TANDEM_ASSIGN_OR_RETURN(CostModel costs, CostsFromFlags(schedule.spec));
  // Grouped rendezvous first (at p=1024, m=4096 each pass reads 10^8 actions); only when it
  // fails is the plain mode checked. A schedule that passes it may still not run with
  // buffered sends (a group that receives before it sends, facing one that does the same),
  // but every schedule here has been checked in that mode already (files by their reader,
  // generated ones by construction), and the simulation below runs in it and reports a
  // deadlock as an error.
  pipeline::ValidationOptions strict;
  strict.grouped_rendezvous = true;
  const bool grouped_ok = pipeline::ValidateSchedule(schedule, strict).ok();
  if (!grouped_ok) {
    // A generated schedule that fails the validator is a bug, not bad input (a file's is
    // refused by its reader).
    absl::Status valid = pipeline::ValidateSchedule(schedule);
    if (!valid.ok()) {
      return absl::InternalError(absl::StrCat("schedule invalid: ", valid.message()));
    }
  }

  TANDEM_ASSIGN_OR_RETURN(SimulationResult result, pipeline::Simulate(schedule, costs));

  // The files are written into temporaries as they are made and renamed into place only once
  // every one is made: an error on the way leaves none. None is held whole: at p=1024,
  // m=4096 the schedule is 0.9 GB of JSON and its trace 3.4 GB (5 and 70 GB of memory as
  // nlohmann::json and ChromeTrace). The timeline is simulated again for the trace and the
  // chart, each interval going straight into them (the chart needs the makespan first, to
  // place its boxes).
  std::optional<AtomicFileWriter> output_file;
  if (!output_path.empty()) {
    TANDEM_ASSIGN_OR_RETURN(output_file, AtomicFileWriter::Open(output_path));
    pipeline::WriteScheduleJson(schedule, *output_file);
  }
  std::optional<AtomicFileWriter> csv_file;
  if (!to_csv.empty()) {
    TANDEM_ASSIGN_OR_RETURN(csv_file, AtomicFileWriter::Open(to_csv));
    TANDEM_RETURN_IF_ERROR(pipeline::WriteTorchCsvSchedule(
        schedule,
        csv_transfers ? pipeline::TorchCsvForm::kWithCommunication
                      : pipeline::TorchCsvForm::kComputeOnly,
        *csv_file));
  }
  std::optional<pipeline::SimulatedTraceFile> trace_file;
  if (!trace_path.empty()) {
    TANDEM_ASSIGN_OR_RETURN(trace_file, pipeline::SimulatedTraceFile::Open(trace_path, schedule));
  }
  std::optional<AtomicFileWriter> svg_file;
  std::optional<pipeline::GanttSvg> chart;
  if (!svg_path.empty()) {
    TANDEM_ASSIGN_OR_RETURN(svg_file, AtomicFileWriter::Open(svg_path));
    chart.emplace(schedule.NumRanks(), result.makespan_seconds, result.bubble_ratio,
                  pipeline::GanttSvg::ComputeBoxes(schedule));
  }
  if (trace_file || chart) {
    SimulationOptions streamed;
    streamed.on_interval = [&](const pipeline::SimulatedInterval& interval) {
      if (trace_file) trace_file->Add(interval);
      if (chart) chart->Add(schedule, interval);
    };
    TANDEM_RETURN_IF_ERROR(pipeline::Simulate(schedule, costs, streamed).status());
  }
  if (svg_file) svg_file->Append(chart->Render());
  std::string report = format == "json" ? JsonReport(schedule.spec, schedule.NumActions(), result, grouped_ok).dump(2) + "\n"
                                        : TextReport(schedule, schedule.NumActions(), result, grouped_ok);
  if (trace_file) {
    const int64_t bytes = trace_file->bytes();
    TANDEM_RETURN_IF_ERROR(trace_file->Close());
    if (bytes > kLargeTraceBytes) {
      std::cerr << absl::StrFormat(
          "note: --trace wrote %.1f GB of JSON; Perfetto's web UI opens about 1-2 GB in a "
          "browser (trace_processor_shell --httpd serves it larger ones); fewer micro-batches "
          "show the same pattern\n",
          static_cast<double>(bytes) / 1e9);
    }
  }
  if (svg_file) TANDEM_RETURN_IF_ERROR(svg_file->Commit());
  if (output_file) TANDEM_RETURN_IF_ERROR(output_file->Commit());
  if (csv_file) TANDEM_RETURN_IF_ERROR(csv_file->Commit());
  std::cout << report;
  *exit_code = kExitOk;
  return absl::OkStatus();
}

int RunSchedule(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return ReportError("schedule", absl::InvalidArgumentError(absl::StrCat(
                                       "unexpected argument '", args[0], "'")));
  }
  int exit_code = kExitFailure;
  absl::Status status = Run(&exit_code);
  if (!status.ok()) return ReportError("schedule", status);
  return exit_code;
}

const CommandRegistrar registrar({
    .name = "schedule",
    .summary = "generate, validate and simulate a pipeline schedule",
    .usage =
        "tandem schedule --schedule {gpipe,1f1b,interleaved,chimera,hanayo,zb-h1,zb-v,"
        "dualpipe,dualpipev} --stages P --microbatches M [--chunks V] [--waves W]\n"
        "    | --from-csv FILE\n"
        "    [--forward F --backward B [--weight W] | --costs FILE] [--latency S] "
        "[--bandwidth RATE --activation-bytes BYTES]\n"
        "    [--format text|json] [--trace FILE] [--svg FILE] [--output FILE] [--transfers]\n"
        "    [--to-csv FILE [--csv-transfers]]\n\n"
        "Generates the per-rank programs, checks them with the validator (buffered sends and\n"
        "blocking receives; also reports whether grouped rendezvous transfers would work),\n"
        "simulates them and prints the grid and the statistics: makespan, bubble ratio\n"
        "(1 - busy / (ranks x makespan)), per-rank busy and idle time and peak stashed\n"
        "activations in units of one stage's activation for one micro-batch. --forward and\n"
        "--backward are times of one stage (1/p of the model); a chunk takes its share.\n"
        "--output writes the schedule (spec, placement, programs) as JSON. Files are written\n"
        "as they are made and appear only when all are done; past 100,000 computes --svg draws\n"
        "each pixel column in the type that fills most of it. zb-v's order is\n"
        "planned for equal forward, input- and weight-gradient times unless --planning-costs\n"
        "F,Bi,W gives others (say the ones you simulate with). --from-csv reads a schedule in\n"
        "torch.distributed.pipelining's CSV format (its _dump_csv) instead, --to-csv writes one\n"
        "(compute only, or lowered with its transfers: --csv-transfers or a lowered input).\n"
        "With no file to write, hanayo, zb-v and chimera (past 4,000 computes for the text\n"
        "report) are validated and simulated while they are generated, never held whole: the\n"
        "same report in a fifth of the memory at 1,024 ranks.",
    .flags = {"schedule", "stages", "microbatches", "chunks", "waves", "planning_costs",
              "forward", "backward", "weight", "costs", "latency", "bandwidth",
              "activation_bytes", "format", "trace", "svg", "output", "transfers", "from_csv",
              "to_csv", "csv_transfers"},
    .aliases = {},
    .run = RunSchedule,
});

}  // namespace
}  // namespace tandem::cli
