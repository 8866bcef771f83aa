// Flags shared by several subcommands (each defined once here; a command lists the names it
// accepts in its CommandInfo). Flags used by one command only are defined in its own file.
// On the command line, '-' and '_' in names are interchangeable: --seq-len == --seq_len.
#pragma once

#include <string>
#include <vector>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(int, stages);
ABSL_DECLARE_FLAG(int, microbatches);
ABSL_DECLARE_FLAG(int, chunks);
ABSL_DECLARE_FLAG(int, waves);
ABSL_DECLARE_FLAG(std::string, planning_costs);
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(int, devices);
ABSL_DECLARE_FLAG(std::string, memory);
ABSL_DECLARE_FLAG(std::vector<std::string>, bandwidth);
ABSL_DECLARE_FLAG(int, seed);
ABSL_DECLARE_FLAG(std::string, trace);
