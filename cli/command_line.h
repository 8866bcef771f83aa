// Runs one command line: `PROGRAM COMMAND [flags]`, `PROGRAM --help`, `PROGRAM help COMMAND`,
// `PROGRAM --version`. The command is looked up among those registered (cli/command.h); one
// that another program beside this one holds is run by exec of that program. Returns the exit
// code (0 done, 1 runtime failure, 2 bad input). An exception escaping a command ends in one
// line on stderr, never an abort.
#pragma once

namespace tandem::cli {

int RunCommandLine(int argc, char** argv);

// Whether the arguments ask for an elastic job (--elastic, --elastic=true or =1): its programs
// take SIGUSR1 and SIGUSR2 as requests from their start (cli/torch/elastic_train.h).
bool ArgumentsAskForElastic(int argc, char** argv);

}  // namespace tandem::cli
