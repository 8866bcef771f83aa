// Reference files made by a Python script of the implementation tandem must agree with
// (transformers, tokenizers), for the tests that compare against it: made once per test
// program, in a fresh temporary folder removed at exit; the tests skip, with the reason, where
// Python cannot import the modules the script needs.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "tests/support/command.h"

namespace tandem::testing {

struct PythonReference {
  std::string folder;
  std::string unavailable;  // non-empty: skip, with this reason
  std::string failed;       // non-empty: the script failed
};

// Runs `python3 SCRIPT make FOLDER` when `python3 -c 'import MODULES'` works. `name` names the
// folder and the messages.
inline PythonReference MakePythonReference(const std::string& modules, const std::string& script,
                                           const std::string& name) {
  static std::vector<std::string>* folders = [] {
    auto* made = new std::vector<std::string>;
    std::atexit([] {
      for (const std::string& folder : *folders) std::filesystem::remove_all(folder);
    });
    return made;
  }();
  PythonReference made;
  const Outcome probe = RunCommand(absl::StrCat("python3 -c 'import ", modules, "'"));
  if (probe.exit_status != 0) {
    made.unavailable = absl::StrCat("python3 cannot import ", modules, " (exit ",
                                    probe.exit_status, "); scripts/python_env.sh installs them: ",
                                    probe.output.substr(0, 400));
    return made;
  }
  made.folder = (std::filesystem::temp_directory_path() /
                 absl::StrCat("tandem_", name, "_reference_", ::getpid()))
                    .string();
  std::filesystem::remove_all(made.folder);
  folders->push_back(made.folder);
  const Outcome written =
      RunCommand(absl::StrCat("python3 '", script, "' make '", made.folder, "'"));
  if (written.exit_status != 0) {
    made.failed = absl::StrCat(name, " reference script failed (exit ", written.exit_status,
                               "): ", written.output);
  }
  return made;
}

}  // namespace tandem::testing

// In a test: skips where the reference is unavailable, fails where its script failed.
#define TANDEM_REQUIRE_PYTHON_REFERENCE(reference)                          \
  do {                                                                      \
    const ::tandem::testing::PythonReference& ref_ = (reference);            \
    if (!ref_.unavailable.empty()) GTEST_SKIP() << ref_.unavailable;        \
    ASSERT_TRUE(ref_.failed.empty()) << ref_.failed;                        \
  } while (false)
