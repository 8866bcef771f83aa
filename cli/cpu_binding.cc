#include "cli/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <thread>

#include "absl/strings/numbers.h"

namespace tandem::cli {

int LocalRanks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* value = std::getenv(name);
    int n = 0;
    if (value != nullptr && absl::SimpleAtoi(value, &n) && n > 0) return n;
  }
  return 1;
}

int UsableCores() {
#ifdef CPU_COUNT
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int WidenDefaultMpiBinding() {
#ifdef CPU_COUNT
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / LocalRanks());
  const int before = UsableCores();
  if (before >= share || std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr ||
      std::getenv("OMPI_MCA_hwloc_base_binding_policy") != nullptr) {
    return 0;
  }
  int local_rank = 0;
  const char* text = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (text == nullptr || !absl::SimpleAtoi(text, &local_rank) || local_rank < 0) return 0;
  const int first = local_rank * share;
  if (first + share > cores || first + share > CPU_SETSIZE) return 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu = first; cpu < first + share; ++cpu) CPU_SET(cpu, &set);
  // This thread (threads started later inherit it), then those already running (MPI's and the
  // communication layer's when called late): left on the one core, they would preempt a
  // compute thread there whenever they wake.
  if (sched_setaffinity(0, sizeof(set), &set) != 0) return 0;
  std::error_code error;
  for (std::filesystem::directory_iterator task("/proc/self/task", error), end;
       !error && task != end; task.increment(error)) {
    int tid = 0;
    if (absl::SimpleAtoi(task->path().filename().string(), &tid)) {
      sched_setaffinity(tid, sizeof(set), &set);  // best effort
    }
  }
  return before;
#else
  return 0;
#endif
}

}  // namespace tandem::cli
