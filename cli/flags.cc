#include "cli/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, schedule, "",
          "pipeline schedule: gpipe, 1f1b, interleaved, chimera, hanayo, zb-h1, zb-v");
ABSL_FLAG(int, stages, 0, "pipeline stages (ranks per pipeline), p");
ABSL_FLAG(int, microbatches, 0, "micro-batches per iteration per pipeline, m");
ABSL_FLAG(int, chunks, 1, "model chunks per rank for interleaved 1F1B, v");
ABSL_FLAG(int, waves, 1, "waves for Hanayo (each rank holds 2*W chunks), W");
ABSL_FLAG(std::string, planning_costs, "",
          "zb-v: the relative forward, input-gradient and weight-gradient times its order is "
          "planned with, F,Bi,W (say 1,1.15,0.8); default: equal (train: the GPT's FLOP "
          "estimates)");
ABSL_FLAG(std::string, format, "text", "output format: text or json");
ABSL_FLAG(std::string, output, "", "output file (written atomically; '-' for stdout)");
ABSL_FLAG(int, devices, 0, "number of devices");
ABSL_FLAG(std::string, memory, "", "memory per device, e.g. 8GiB, 80GB, 1.5e9");
ABSL_FLAG(std::vector<std::string>, bandwidth, {},
          "bandwidth per level in bytes/s, innermost first (repeat or comma-separate), e.g. "
          "25GiB/s");
ABSL_FLAG(int, seed, 1234, "random seed");
ABSL_FLAG(std::string, trace, "", "write a Chrome-trace JSON timeline here (opens in Perfetto)");
