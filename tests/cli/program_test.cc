// The `tandem` program without LibTorch (its path is the first argument): it links neither
// LibTorch nor MPI nor CUDA, starts within a small memory bound, still lists train and
// profile, and runs them through tandem-torch beside it (help, flag errors and exit codes as
// before); without tandem-torch (or in a build without LibTorch) they fail with one line and
// exit 2.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/torch_commands.h"
#include "common/config.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string g_tandem;  // path of the tandem program

struct ProgramRun {
  int exit_code = -1;
  std::string out;
  std::string err;
  double peak_rss_mb = 0;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `program args` (no shell, so the child's rusage is the program's own).
ProgramRun RunProgram(const std::string& program, std::vector<std::string> args) {
  const std::string base = absl::StrCat(testing::TempDir(), "/program_test_", ::getpid());
  const std::string out_path = base + ".out", err_path = base + ".err";
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ProgramRun run;
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || ::wait4(pid, &status, 0, &usage) != pid) return run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.peak_rss_mb = usage.ru_maxrss / 1024.0;
  run.out = ReadAll(out_path);
  run.err = ReadAll(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  return run;
}

ProgramRun Tandem(std::vector<std::string> args) { return RunProgram(g_tandem, std::move(args)); }

int Lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

class ProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_tandem.empty()) GTEST_SKIP() << "no tandem program given";
  }
};

TEST_F(ProgramTest, LinksNeitherLibTorchNorMpiNorCuda) {
  const std::string command = absl::StrCat("ldd ", g_tandem, " 2>&1");
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string libraries;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    libraries.append(buffer.data(), n);
  }
  ASSERT_EQ(::pclose(pipe), 0) << libraries;
  ASSERT_TRUE(absl::StrContains(libraries, "libc.so")) << libraries;
  for (const char* library : {"libtorch", "libc10", "libmpi", "libcudart", "libnccl"}) {
    EXPECT_FALSE(absl::StrContains(libraries, library)) << library << " in\n" << libraries;
  }
}

TEST_F(ProgramTest, CommandsThatDoNotTrainStartSmall) {
  // LibTorch alone made every start about 160 MB; a start of `tandem` is about 5 MB.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer run-times have memory figures of their own";
#endif
  constexpr double kBoundMb = 32;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--version"},
        {"schedule", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"}}) {
    const ProgramRun run = Tandem(args);
    ASSERT_EQ(run.exit_code, 0) << args[0] << ": " << run.err;
    EXPECT_LT(run.peak_rss_mb, kBoundMb) << args[0];
  }
}

TEST_F(ProgramTest, HelpListsEveryCommandWithItsSummary) {
  const ProgramRun run = Tandem({"--help"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (const std::string& line :
       {absl::StrCat("train      ", cli::kTrainSummary),
        absl::StrCat("profile    ", cli::kProfileSummary), std::string("plan       plan partition"),
        std::string("schedule   generate, validate")}) {
    EXPECT_TRUE(absl::StrContains(run.out, line)) << line << " not in\n" << run.out;
  }
  EXPECT_EQ(absl::StrContains(run.out, "[not in this build]"), !TANDEM_HAVE_TORCH) << run.out;
}

TEST_F(ProgramTest, LibTorchCommandsRunInTandemTorch) {
  if (!TANDEM_HAVE_TORCH) GTEST_SKIP() << "built without LibTorch";
  ProgramRun run = Tandem({"train", "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(absl::StartsWith(run.out, absl::StrCat("tandem train: ", cli::kTrainSummary)))
      << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "--seq-len")) << run.out;
  run = Tandem({"help", "profile"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "--microbatch-size")) << run.out;
  // Errors come from tandem-torch's parser, worded and coded as tandem's own.
  run = Tandem({"train", "--bogus"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "tandem train: error: unknown flag '--bogus' for 'tandem train' (see tandem train "
            "--help)\n");
  run = Tandem({"profile", "--layers", "many"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_TRUE(absl::StartsWith(run.err, "tandem profile: error: bad value for --layers"))
      << run.err;
  EXPECT_EQ(Lines(run.err), 1) << run.err;
}

TEST_F(ProgramTest, FoundThroughASymbolicLink) {
  if (!TANDEM_HAVE_TORCH) GTEST_SKIP() << "built without LibTorch";
  const std::string link = absl::StrCat(testing::TempDir(), "/tandem_link_", ::getpid());
  std::filesystem::remove(link);
  std::filesystem::create_symlink(std::filesystem::absolute(g_tandem), link);
  const ProgramRun run = RunProgram(link, {"train", "--help"});
  std::filesystem::remove(link);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "--seq-len")) << run.out;
}

TEST_F(ProgramTest, WithoutTheLibTorchPartTrainSaysSoAndExitsTwo) {
  // A copy of tandem alone in a folder: no tandem-torch beside it.
  const std::string dir = absl::StrCat(testing::TempDir(), "/tandem_alone_", ::getpid());
  tandem::RemoveAll(dir).IgnoreError();
  std::filesystem::create_directories(dir);
  const std::string copy = dir + "/tandem";
  std::filesystem::copy_file(g_tandem, copy);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"train", "--help"},
                                               {"profile", "--layers", "2"},
                                               {"help", "train"}}) {
    const ProgramRun run = RunProgram(copy, args);
    EXPECT_EQ(run.exit_code, 2) << args[0];
    EXPECT_EQ(Lines(run.err), 1) << run.err;
    EXPECT_TRUE(absl::StartsWith(
        run.err, absl::StrCat("tandem ", args[0] == "help" ? args[1] : args[0], ": error: ")))
        << run.err;
    if (TANDEM_HAVE_TORCH) {
      EXPECT_TRUE(
          absl::StrContains(run.err, absl::StrCat("tandem_alone_", ::getpid(), "/tandem-torch")))
          << run.err;
      EXPECT_TRUE(absl::StrContains(run.err, "is missing")) << run.err;
    } else {
      EXPECT_TRUE(absl::StrContains(run.err, "this build has no LibTorch")) << run.err;
    }
    EXPECT_TRUE(run.out.empty()) << run.out;
  }
  // The other commands do not need it.
  EXPECT_EQ(
      RunProgram(copy, {"schedule", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2"})
          .exit_code,
      0);
  tandem::RemoveAll(dir).IgnoreError();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc > 1) tandem::g_tandem = argv[1];
  return RUN_ALL_TESTS();
}
