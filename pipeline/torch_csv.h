// Schedules in torch.distributed.pipelining's CSV format (`_PipelineScheduleRuntime._load_csv`
// and `_dump_csv`; torchtitan loads custom schedules the same way).
//
// One row per pipeline rank, one cell per action, rows ending in "\r\n" (Python's csv module).
// A cell is `<stage><type><micro-batch>` with the stage a virtual stage of the one pipeline:
//   F, I, W, B        forward, input gradient (tandem's Bi), weight gradient, whole backward
//   SEND_F, RECV_F    the activation leaving stage s (to s+1), arriving at stage s (from s-1)
//   SEND_B, RECV_B    the input gradient leaving stage s (to s-1), arriving at s (from s+1)
//   REDUCE_GRAD       (no micro-batch) the stage's gradient reduction: tandem's GradientSync
//   (a;b)OVERLAP_F_B  a forward and a backward torch may overlap (its DualPipeV): run in order
//   UNSHARD, RESHARD, WAIT_REDUCE_GRAD (no micro-batch), WAIT_SEND_F, WAIT_SEND_B: torch's
//                     FSDP and send bookkeeping, which tandem's runtime does itself: skipped
// and an empty cell is an idle step of torch's own simulation (skipped). A file with only F,
// I, W, B (and OVERLAP_F_B) cells is torch's "compute_only" form, whose transfers the reader
// places as CompleteSchedule does; one with SEND/RECV cells is its lowered "compute_comms"
// form, whose transfers and REDUCE_GRAD are kept where they stand.
//
// What is read: a ScheduleKind::kCustom schedule: p = the rows, stages = the largest stage
// + 1 (a multiple of p: chunks = stages / p), m = the largest micro-batch + 1, the placement
// found from which row runs each stage: looped (stage s on rank s % p, torch's "loop" style)
// or in waves (down the ranks and back up, torch's "v" style); anything else is refused. The
// result passes the validator, or the reader fails. Every error is one line naming the file,
// the row (rank) and the cell: "s.csv: rank 1, cell 4 ('2Q1'): unknown action type 'Q'".
//
// What is written: from any schedule with one pipeline replica (not Chimera or DualPipe,
// which torch's format cannot express): its compute actions in program order, and in the
// lowered form its transfers and GradientSyncs too (REDUCE_GRAD). A schedule read from a file
// is written back as that file without its idle cells, its OVERLAP_F_B groups (written as
// their two actions) and its bookkeeping cells (see above). torch's own reader accepts the
// compute-only form; the lowered form it reads only with its WAIT_SEND cells, which tandem
// does not write.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule.h"

namespace tandem {
class AtomicFileWriter;  // common/file_util.h
}  // namespace tandem

namespace tandem::pipeline {

enum class TorchCsvForm : uint8_t {
  kComputeOnly,        // F, I, W, B only: torch's format="compute_only"
  kWithCommunication,  // also SEND_F, RECV_F, SEND_B, RECV_B and REDUCE_GRAD
};

// Parses CSV text (see above). `where` names the source in errors (a path).
absl::StatusOr<Schedule> ParseTorchCsvSchedule(absl::string_view text,
                                               absl::string_view where = "csv");
// Reads and parses a file of at most 1 GiB.
absl::StatusOr<Schedule> ReadTorchCsvSchedule(const std::string& path);

// Whether CSV text holds communication actions (torch's lowered form), so that a caller can
// write a schedule back in the form it was read in.
bool TorchCsvHasCommunication(absl::string_view text);

// The schedule in torch's format. InvalidArgument for a schedule with two pipeline replicas.
absl::StatusOr<std::string> FormatTorchCsvSchedule(const Schedule& schedule, TorchCsvForm form);
// The same, appended to `file` a rank at a time (at p=1024, m=4096 the text is 0.7 GB).
absl::Status WriteTorchCsvSchedule(const Schedule& schedule, TorchCsvForm form,
                                   AtomicFileWriter& file);

}  // namespace tandem::pipeline
