// Runs a command as a user would from a shell, for tests of the command-line programs: its exit
// status and everything it printed (stdout and stderr together). Test-only; header-only.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

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

// main() of a test of a program whose path is its one argument: stores it in `path` and runs
// the tests; without it prints "usage: TEST WHAT" and returns 2.
inline int RunTestsWithProgramPath(int argc, char** argv, const char* what, std::string* path) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s %s\n", argv[0], what);
    return 2;
  }
  *path = argv[1];
  return RUN_ALL_TESTS();
}

}  // namespace tandem::testing
