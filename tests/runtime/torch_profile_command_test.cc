// `tandem profile` end to end: a tiny GPT's profile through the command line is a valid
// profile.json with the model's layers; bad input exits with code 2, one line naming the
// problem, and writes nothing.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "pipeline/profile.h"

namespace tandem {
namespace {

struct CommandRun {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

CommandRun Tandem(const std::string& args) {
  const std::string command =
      "OMP_NUM_THREADS=1 " + std::string(TANDEM_BIN) + " " + args + " 2>&1";
  CommandRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

const char kTinyGpt[] =
    "profile --layers 3 --hidden 32 --heads 4 --seq-len 16 --microbatch-size 2 --warmup 1 "
    "--repeats 3";

TEST(ProfileCommand, WritesAValidProfileOfEveryLayer) {
  const std::string path = testing::TempDir() + "/tiny_gpt_profile.json";
  std::remove(path.c_str());
  const CommandRun run = Tandem(std::string(kTinyGpt) + " --optimizer sgd -o " + path);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "block2")) << run.out;
  auto profile = pipeline::ReadProfileFile(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->layers.size(), 5u);  // embedding, 3 blocks, head
  EXPECT_EQ(profile->microbatch_size, 2);
  EXPECT_EQ(profile->layers[1].name, "block0");
  EXPECT_GT(profile->layers[1].forward_seconds, 0);
  // SGD keeps one momentum buffer per parameter.
  EXPECT_DOUBLE_EQ(profile->layers[1].optimizer_state_bytes, profile->layers[1].parameter_bytes);
  std::remove(path.c_str());
}

TEST(ProfileCommand, BadInputExitsTwoWithOneLineAndNoFile) {
  const std::string path = testing::TempDir() + "/never_written.json";
  std::remove(path.c_str());
  for (const std::string& bad :
       {std::string("--hidden 30"), std::string("--layers 0"), std::string("--model bert"),
        std::string("--data /nonexistent/text.txt"), std::string("--optimizer adam"),
        std::string("--microbatch-size 0"), std::string("--device tpu"),
        std::string("--no-such-flag 1")}) {
    const CommandRun run = Tandem(std::string(kTinyGpt) + " " + bad + " -o " + path);
    EXPECT_EQ(run.exit_code, 2) << bad << ": " << run.out;
    const std::vector<std::string> lines =
        absl::StrSplit(run.out, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 1u) << bad << ": " << run.out;
    EXPECT_TRUE(absl::StrContains(run.out, "error")) << run.out;
    EXPECT_FALSE(Exists(path)) << bad;
  }
  // An output it cannot write is refused before the model is measured.
  const CommandRun run = Tandem(std::string(kTinyGpt) + " -o /nonexistent/profile.json");
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "-o")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "/nonexistent/profile.json")) << run.out;
  EXPECT_FALSE(absl::StrContains(run.out, "block0")) << run.out;
}

}  // namespace
}  // namespace tandem
