// Start-up cost of the `tandem` program: wall time and peak resident memory of each command,
// measured on the child process (fork, exec, wait4's rusage), median of several runs, every
// command run in turn in each round so that the figures are taken side by side. The
// reference is `tandem train --help`, which loads LibTorch (it runs in tandem-torch); the
// commands that do not train should cost a small fraction of it (the goal: at most
// 20 ms and a few megabytes).
//
//   cli_startup_bench [--runs N] [--tandem PATH] [--compare PATH]
//
// --tandem measures another tandem program than this build's; --compare also measures a second
// one (e.g. an older build) in the same rounds and prints its figures with the ratios of the
// first to it. The row "floor" is /bin/true: what starting any program costs here (the
// launcher's share of peak RSS included).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/config.h"

namespace {

struct Case {
  std::string label;
  std::vector<std::string> args;  // after the program's path; empty program = /bin/true
  bool floor = false;             // runs /bin/true instead of tandem
  bool reference = false;         // the LibTorch path the others are compared with
};

struct Sample {
  double wall_ms = 0;
  double peak_rss_mb = 0;
};

std::vector<Case> Cases() {
  const std::string data = TANDEM_BENCH_DATA_DIR;
  std::vector<Case> cases = {
      {"floor: /bin/true", {}, /*floor=*/true},
      {"tandem --version", {"--version"}},
      {"tandem --help", {"--help"}},
      {"tandem schedule 1f1b p=4 m=8 (grid)",
       {"schedule", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"}},
      {"tandem plan pipedream vgg16, 8 devices",
       {"plan", "--profile", data + "/pipedream/vgg16.graph.txt", "--profile-format", "pipedream",
        "--algorithm", "pipedream", "--devices", "8", "--bandwidth", "1e9"}},
      {"tandem plan piper bert32, 64 devices",
       {"plan", "--profile", data + "/piper/bert32a100.json", "--profile-format", "piper",
        "--algorithm", "piper", "--devices", "64", "--memory", "8GiB", "--microbatches", "1920",
        "--bandwidth", "25GiB/s"}},
  };
  if (TANDEM_HAVE_TORCH) {
    cases.push_back({"tandem train --help (LibTorch: reference)",
                     {"train", "--help"},
                     /*floor=*/false,
                     /*reference=*/true});
  }
  return cases;
}

// Runs `program args` with stdout and stderr to /dev/null; exits the bench if it fails (a
// command that fails early would look fast).
Sample RunOnce(const std::string& program, const std::vector<std::string>& args) {
  std::vector<std::string> words = {program};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (::wait4(pid, &status, 0, &usage) != pid) {
    std::perror("wait4");
    std::exit(1);
  }
  const auto end = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string line = program;
    for (const std::string& arg : args) line += " " + arg;
    std::fprintf(stderr, "cli_startup_bench: '%s' failed (%s %d)\n", line.c_str(),
                 WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    std::exit(1);
  }
  Sample sample;
  sample.wall_ms = std::chrono::duration<double, std::milli>(end - start).count();
  sample.peak_rss_mb = usage.ru_maxrss / 1024.0;  // kilobytes on Linux
  return sample;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Sample MedianOf(const std::vector<Sample>& samples) {
  std::vector<double> wall, rss;
  for (const Sample& s : samples) {
    wall.push_back(s.wall_ms);
    rss.push_back(s.peak_rss_mb);
  }
  return {Median(wall), Median(rss)};
}

[[noreturn]] void Usage() {
  std::fprintf(stderr, "usage: cli_startup_bench [--runs N] [--tandem PATH] [--compare PATH]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 7;
  std::vector<std::string> programs = {TANDEM_BENCH_PROGRAM};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage();
    if (arg == "--runs") {
      runs = std::atoi(argv[++i]);
      if (runs < 1) Usage();
    } else if (arg == "--tandem") {
      programs[0] = argv[++i];
    } else if (arg == "--compare") {
      programs.push_back(argv[++i]);
    } else {
      Usage();
    }
  }
  const std::vector<Case> cases = Cases();
  const bool have_true = ::access("/bin/true", X_OK) == 0;
  // samples[program][case]
  std::vector<std::vector<std::vector<Sample>>> samples(
      programs.size(), std::vector<std::vector<Sample>>(cases.size()));
  for (size_t p = 0; p < programs.size(); ++p) {  // one untimed round: page cache, not disk
    for (const Case& c : cases) {
      if (!c.floor) RunOnce(programs[p], c.args);
    }
  }
  for (int round = 0; round < runs; ++round) {
    for (size_t c = 0; c < cases.size(); ++c) {
      for (size_t p = 0; p < programs.size(); ++p) {
        if (cases[c].floor && (p > 0 || !have_true)) continue;
        samples[p][c].push_back(cases[c].floor ? RunOnce("/bin/true", {})
                                               : RunOnce(programs[p], cases[c].args));
      }
    }
  }

  std::vector<std::vector<Sample>> median(programs.size(), std::vector<Sample>(cases.size()));
  int reference = -1;
  for (size_t p = 0; p < programs.size(); ++p) {
    for (size_t c = 0; c < cases.size(); ++c) {
      if (!samples[p][c].empty()) median[p][c] = MedianOf(samples[p][c]);
      if (cases[c].reference) reference = static_cast<int>(c);
    }
  }
  std::printf(
      "tandem start-up: wall time and peak RSS of the child process (wait4), median of "
      "%d runs, side by side\n\n",
      runs);
  std::printf("%s\n", programs[0].c_str());
  std::printf("%-44s %10s %12s %10s %10s\n", "command", "wall ms", "peak RSS MB", "wall/ref",
              "RSS/ref");
  for (size_t c = 0; c < cases.size(); ++c) {
    if (samples[0][c].empty()) continue;
    const Sample& s = median[0][c];
    if (reference >= 0) {
      const Sample& r = median[0][reference];
      std::printf("%-44s %10.1f %12.1f %10.4f %10.4f\n", cases[c].label.c_str(), s.wall_ms,
                  s.peak_rss_mb, s.wall_ms / r.wall_ms, s.peak_rss_mb / r.peak_rss_mb);
    } else {
      std::printf("%-44s %10.1f %12.1f %10s %10s\n", cases[c].label.c_str(), s.wall_ms,
                  s.peak_rss_mb, "-", "-");
    }
  }
  if (reference < 0) std::printf("(no LibTorch in this build: no reference row)\n");
  for (size_t p = 1; p < programs.size(); ++p) {
    std::printf("\ncompared with %s (ratios: first program / this one)\n", programs[p].c_str());
    std::printf("%-44s %10s %12s %10s %10s\n", "command", "wall ms", "peak RSS MB", "wall ratio",
                "RSS ratio");
    for (size_t c = 0; c < cases.size(); ++c) {
      if (samples[p][c].empty()) continue;
      const Sample& s = median[p][c];
      const Sample& first = median[0][c];
      std::printf("%-44s %10.1f %12.1f %10.4f %10.4f\n", cases[c].label.c_str(), s.wall_ms,
                  s.peak_rss_mb, first.wall_ms / s.wall_ms, first.peak_rss_mb / s.peak_rss_mb);
    }
  }
  return 0;
}
