// `tandem` and `tandem-torch`: one main, the subcommands each program registers (see
// cli/command.h). `tandem` hands the commands it lists but does not hold to the program beside
// it that does (cli/torch_commands.h).
#include "cli/command_line.h"

int main(int argc, char** argv) { return tandem::cli::RunCommandLine(argc, argv); }
