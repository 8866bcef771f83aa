#include "cluster/internal/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

extern char** environ;

namespace tandem::cluster::internal {

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& environment,
                            const std::string& output) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: no program");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (environment.count(name) == 0) env_strings.push_back(entry);
  }
  for (const auto& [name, value] : environment) env_strings.push_back(name + "=" + value);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attributes, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  pid_t pid = -1;
  const int error = posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("starting ", argv[0], ": ", std::strerror(error)));
  }
  return pid;
}

absl::Status EndWithThisProcess(pid_t job) {
  // alive PID: its /proc state exists and is not Z (a zombie has ended). The guard runs in a
  // background subshell, so the shell Spawn starts ends at once and is reaped here.
  const std::string script = absl::StrCat(
      "(alive() { s=$(cut -d' ' -f3 /proc/$1/stat 2>/dev/null); [ -n \"$s\" ] && "
      "[ \"$s\" != Z ]; }; while alive ", ::getpid(), " && alive ", job,
      "; do sleep 1; done; alive ", job, " && kill -TERM -", job,
      ") </dev/null >/dev/null 2>&1 &");
  TANDEM_ASSIGN_OR_RETURN(const pid_t shell, Spawn({"/bin/sh", "-c", script}, {}, "/dev/null"));
  int status = 0;
  ::waitpid(shell, &status, 0);
  return absl::OkStatus();
}

int ReapIfEnded(pid_t pid) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return -1;
  if (r < 0) return errno == ECHILD ? 0 : -1;  // reaped already
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

namespace {

// Calls `visit(pid, environment items)` for every process whose environment this user can read.
template <typename Visit>
void ForEachProcessEnvironment(Visit visit) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* entry = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    const std::string environment = text.str();
    visit(static_cast<pid_t>(pid),
          std::vector<absl::string_view>(absl::StrSplit(environment, '\0')));
  }
  ::closedir(proc);
}

}  // namespace

std::map<int, pid_t> ProcessesTagged(const std::string& tag_name, const std::string& tag_value,
                                     const std::string& key_name) {
  std::map<int, pid_t> found;
  const std::string tag = tag_name + "=" + tag_value;
  const std::string key = key_name + "=";
  ForEachProcessEnvironment([&](pid_t pid, const std::vector<absl::string_view>& items) {
    bool tagged = false;
    int value = -1;
    for (absl::string_view item : items) {
      if (item == tag) tagged = true;
      // Started by a running job (MPI_Comm_spawn): its key numbers another job's processes.
      if (absl::StartsWith(item, "OMPI_PARENT_PORT=")) return;
      if (absl::StartsWith(item, key)) {
        if (!absl::SimpleAtoi(item.substr(key.size()), &value)) value = -1;
      }
    }
    if (tagged && value >= 0 && ProcessAlive(pid)) found[value] = pid;
  });
  return found;
}

std::vector<pid_t> AllProcessesTagged(const std::string& tag_name, const std::string& tag_value) {
  std::vector<pid_t> found;
  const std::string tag = tag_name + "=" + tag_value;
  ForEachProcessEnvironment([&](pid_t pid, const std::vector<absl::string_view>& items) {
    if (std::find(items.begin(), items.end(), tag) != items.end() && ProcessAlive(pid)) {
      found.push_back(pid);
    }
  });
  return found;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return ::kill(pid, 0) == 0;
  std::string text;
  std::getline(in, text);
  // "pid (comm) S ...": the state follows the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return true;
  const char state = text[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace tandem::cluster::internal
