// Runs a command as a user would from a shell, for tests of the command-line programs: its exit
// status and everything it printed (stdout and stderr together). Test-only; header-only.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tandem::testing {

struct Outcome {
  int exit_status = -1;
  std::string output;  // stdout and stderr together
};

inline Outcome RunCommand(const std::string& command) {
  Outcome o;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return o;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) o.output.append(buffer, n);
  const int status = pclose(pipe);
  o.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return o;
}

}  // namespace tandem::testing
