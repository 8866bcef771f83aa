// Communication benchmark in the manner of nccl-tests: for each collective and message size,
// the time per operation, algorithm bandwidth (bytes / time) and bus bandwidth (algorithm
// bandwidth times the collective's traffic factor, comparable across group sizes), with a data
// check against a sequential reference. For the MPI backend the same operation is also called
// directly through MPI in the same run, twice: the blocking call (MPI_Allreduce, ...) and the
// non-blocking call completed by an MPI_Test loop (MPI_Iallreduce, ...); the ratio of tandem's
// bus bandwidth to the better of the two is printed. The three are timed in turn, `repeats`
// rounds per size, and each column is the median of its rounds, so that load from other
// processes hits all three alike.
//
// Goal column (issue #12): from 1 MiB, tandem's bus bandwidth is at least 0.9x the better
// MPI's ("pass"/"FAIL"); at the smallest size of 8 bytes or less, its time is at most 1.5x the
// better MPI's. Other rows print "-".
//
//   mpirun -np 2 comm_bench                              # every collective, 8 B .. 256 MB
//   mpirun -np 2 comm_bench --ops=all_reduce --min_bytes=1M --max_bytes=64M
//   mpirun -np 2 comm_bench --verify=false               # without tandem's signature checks
//
// Bus bandwidth factors (nccl-tests' PERFORMANCE.md): all-reduce 2(n-1)/n, reduce-scatter and
// all-gather (n-1)/n, broadcast and send/recv 1. Times are the slowest rank's mean.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "comm/buffer.h"
#include "comm/mpi/mpi_communicator.h"
#include "common/units.h"

ABSL_FLAG(std::string, ops, "all_reduce,reduce_scatter,all_gather,broadcast,send_recv",
          "comma-separated collectives to measure");
ABSL_FLAG(std::string, min_bytes, "8", "smallest message (bytes; units like 1M allowed)");
ABSL_FLAG(std::string, max_bytes, "256MiB", "largest message");
ABSL_FLAG(int, factor, 2, "size multiplier between rows");
ABSL_FLAG(double, seconds_per_size, 0.2,
          "target measuring time per size and implementation (over all repeats)");
ABSL_FLAG(int, repeats, 5, "interleaved rounds per size; each column is the median");
ABSL_FLAG(int, warmup, 2, "untimed operations before each measurement");
ABSL_FLAG(bool, verify, false,
          "tandem's cross-rank signature check before each collective (a debug mode)");
ABSL_FLAG(bool, check, true, "check results against a sequential reference");
ABSL_FLAG(bool, mpi, true, "also time the operation called directly through MPI");
ABSL_FLAG(bool, tandem, true, "time tandem's operation (false: direct MPI only, for diagnosis)");

namespace {

using tandem::comm::Buffer;
using tandem::comm::CpuBuffer;
using tandem::comm::MpiCommunicator;
using tandem::comm::Shard;
using tandem::comm::ShardRange;
using tandem::comm::WorkPtr;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ParseBytesFlag(const std::string& text) {
  auto parsed = tandem::ParseBytes(text);
  if (!parsed.ok()) {
    std::fprintf(stderr, "bad size '%s': %s\n", text.c_str(), parsed.status().ToString().c_str());
    std::exit(2);
  }
  return static_cast<int64_t>(*parsed);
}

// One collective: how to run it through tandem and through MPI, its bus factor, and a check.
struct Collective {
  std::string name;
  double bus_factor;
  std::function<void(int64_t count)> prepare;  // fill inputs for the check
  std::function<void()> run_tandem;
  std::function<void()> run_mpi;     // blocking MPI call
  std::function<void()> run_mpi_nb;  // non-blocking MPI call completed by an MPI_Test loop
  std::function<int64_t()> errors;  // wrong elements after prepare + run
};

// Operations per timed round, agreed across ranks: about seconds_per_size / repeats.
int Calibrate(const std::function<void()>& run, MPI_Comm comm) {
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) run();
  MPI_Barrier(comm);
  const double start = Now();
  run();
  double once = Now() - start;
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm);
  const double per_round =
      absl::GetFlag(FLAGS_seconds_per_size) / std::max(1, absl::GetFlag(FLAGS_repeats));
  return std::clamp(static_cast<int>(per_round / std::max(once, 1e-7)), 3, 200000);
}

// Mean seconds per operation over `iterations`, maximum over ranks.
double TimeRound(const std::function<void()>& run, int iterations, MPI_Comm comm) {
  MPI_Barrier(comm);
  const double start = Now();
  for (int i = 0; i < iterations; ++i) run();
  double seconds = (Now() - start) / iterations;
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Bandwidth goal from this size; latency goal at sizes up to kLatencyGoalMaxBytes.
constexpr int64_t kBandwidthGoalMinBytes = int64_t{1} << 20;
constexpr double kBandwidthGoalRatio = 0.9;
constexpr int64_t kLatencyGoalMaxBytes = 8;
constexpr double kLatencyGoalRatio = 1.5;

// Completes requests by polling MPI_Testall without yielding: the fastest way to drive
// non-blocking MPI from one thread.
void SpinWait(MPI_Request* requests, int count) {
  int done = 0;
  while (!done) MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
}

void Die(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  absl::SetProgramUsageMessage(
      "tandem's collectives and send/recv against the same operations called directly through "
      "MPI (nccl-tests style: time, algorithm and bus bandwidth, ratio to MPI). Run under "
      "mpirun: mpirun -np 2 comm_bench [flags]");
  absl::ParseCommandLine(argc, argv);
  auto environment = tandem::comm::CommOptions::FromEnvironment();
  Die(environment.status(), "TANDEM_COMM_* environment");
  tandem::comm::CommOptions options = *environment;
  options.verify_collectives = absl::GetFlag(FLAGS_verify);
  auto created = MpiCommunicator::World(options);
  Die(created.status(), "creating the world communicator");
  MpiCommunicator& comm = **created;
  MPI_Comm direct;  // MPI's own path, on its own communicator
  MPI_Comm_dup(MPI_COMM_WORLD, &direct);
  const int rank = comm.rank();
  const int n = comm.size();
  const int64_t min_bytes = ParseBytesFlag(absl::GetFlag(FLAGS_min_bytes));
  const int64_t max_bytes = ParseBytesFlag(absl::GetFlag(FLAGS_max_bytes));
  const int64_t max_count = std::max<int64_t>(max_bytes / 4, 1);
  std::vector<float> input(max_count), output(max_count);
  int64_t count = 0;  // elements of the current row
  std::vector<int> counts(n), displacements(n);
  auto set_shards = [&](int64_t total) {
    for (int r = 0; r < n; ++r) {
      const ShardRange s = Shard(total, n, r);
      counts[r] = static_cast<int>(s.count);
      displacements[r] = static_cast<int>(s.offset);
    }
  };
  auto wait = [&](const WorkPtr& work) {
    const absl::Status status = work->Wait();
    if (!status.ok()) Die(status, work->Describe().c_str());  // described only on failure
  };
  auto value = [](int r, int64_t i) { return static_cast<float>((r + 1) * (i % 5 + 1)); };
  const int peer = rank ^ 1;  // send/recv pairs (0,1), (2,3), ...

  std::vector<Collective> collectives = {
      {"all_reduce", 2.0 * (n - 1) / n,
       [&](int64_t) { for (int64_t i = 0; i < count; ++i) input[i] = value(rank, i); },
       [&] { wait(comm.AllReduce(CpuBuffer(input.data(), count))); },
       [&] {
         MPI_Allreduce(MPI_IN_PLACE, input.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                       direct);
       },
       [&] {
         MPI_Request request;
         MPI_Iallreduce(MPI_IN_PLACE, input.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        direct, &request);
         SpinWait(&request, 1);
       },
       [&] {
         int64_t wrong = 0;
         for (int64_t i = 0; i < count; ++i) {
           float expected = 0;
           for (int r = 0; r < n; ++r) expected += value(r, i);
           wrong += input[i] != expected;
         }
         return wrong;
       }},
      {"reduce_scatter", 1.0 * (n - 1) / n,
       [&](int64_t) { for (int64_t i = 0; i < count; ++i) input[i] = value(rank, i); },
       [&] {
         wait(comm.ReduceScatter(CpuBuffer(input.data(), count),
                                 CpuBuffer(output.data(), counts[rank])));
       },
       [&] {
         MPI_Reduce_scatter(input.data(), output.data(), counts.data(), MPI_FLOAT, MPI_SUM, direct);
       },
       [&] {
         MPI_Request request;
         MPI_Ireduce_scatter(input.data(), output.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                             direct, &request);
         SpinWait(&request, 1);
       },
       [&] {
         int64_t wrong = 0;
         for (int64_t i = 0; i < counts[rank]; ++i) {
           float expected = 0;
           for (int r = 0; r < n; ++r) expected += value(r, displacements[rank] + i);
           wrong += output[i] != expected;
         }
         return wrong;
       }},
      {"all_gather", 1.0 * (n - 1) / n,
       [&](int64_t) {
         for (int64_t i = 0; i < counts[rank]; ++i) input[i] = value(rank, displacements[rank] + i);
       },
       [&] {
         wait(comm.AllGather(CpuBuffer(input.data(), counts[rank]), CpuBuffer(output.data(), count)));
       },
       [&] {
         MPI_Allgatherv(input.data(), counts[rank], MPI_FLOAT, output.data(), counts.data(),
                        displacements.data(), MPI_FLOAT, direct);
       },
       [&] {
         MPI_Request request;
         MPI_Iallgatherv(input.data(), counts[rank], MPI_FLOAT, output.data(), counts.data(),
                         displacements.data(), MPI_FLOAT, direct, &request);
         SpinWait(&request, 1);
       },
       [&] {
         int64_t wrong = 0;
         for (int r = 0; r < n; ++r) {
           for (int64_t i = 0; i < counts[r]; ++i) {
             wrong += output[displacements[r] + i] != value(r, displacements[r] + i);
           }
         }
         return wrong;
       }},
      {"broadcast", 1.0,
       [&](int64_t) { for (int64_t i = 0; i < count; ++i) input[i] = rank == 0 ? value(0, i) : -1; },
       [&] { wait(comm.Broadcast(CpuBuffer(input.data(), count), 0)); },
       [&] { MPI_Bcast(input.data(), static_cast<int>(count), MPI_FLOAT, 0, direct); },
       [&] {
         MPI_Request request;
         MPI_Ibcast(input.data(), static_cast<int>(count), MPI_FLOAT, 0, direct, &request);
         SpinWait(&request, 1);
       },
       [&] {
         int64_t wrong = 0;
         for (int64_t i = 0; i < count; ++i) wrong += input[i] != value(0, i);
         return wrong;
       }},
      {"send_recv", 1.0,
       [&](int64_t) { for (int64_t i = 0; i < count; ++i) input[i] = value(rank, i); },
       [&] {
         if (peer >= n) return;
         WorkPtr recv = comm.Recv(CpuBuffer(output.data(), count), peer);
         WorkPtr send = comm.Send(CpuBuffer(input.data(), count), peer);
         wait(send);
         wait(recv);
       },
       [&] {
         if (peer >= n) return;
         MPI_Sendrecv(input.data(), static_cast<int>(count), MPI_FLOAT, peer, 0, output.data(),
                      static_cast<int>(count), MPI_FLOAT, peer, 0, direct, MPI_STATUS_IGNORE);
       },
       [&] {
         if (peer >= n) return;
         MPI_Request requests[2];
         MPI_Irecv(output.data(), static_cast<int>(count), MPI_FLOAT, peer, 0, direct, &requests[0]);
         MPI_Isend(input.data(), static_cast<int>(count), MPI_FLOAT, peer, 0, direct, &requests[1]);
         SpinWait(requests, 2);
       },
       [&] {
         int64_t wrong = 0;
         if (peer >= n) return wrong;
         for (int64_t i = 0; i < count; ++i) wrong += output[i] != value(peer, i);
         return wrong;
       }},
  };

  const std::vector<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',');
  if (rank == 0) {
    std::printf("# tandem comm_bench: %d ranks, MPI backend (signature checks %s), float32\n", n,
                options.verify_collectives ? "on" : "off");
    std::printf("# times are the slowest rank's mean per operation; busbw in GB/s; mpi: blocking "
                "call, mpi_nb: non-blocking call + MPI_Test loop;\n# ratio = tandem busbw / the "
                "better of the two MPI busbw\n");
  }
  bool all_correct = true;
  int goals_met = 0, goals_missed = 0;
  for (const Collective& c : collectives) {
    if (std::find(wanted.begin(), wanted.end(), c.name) == wanted.end()) continue;
    if (rank == 0) {
      std::printf("\n# %s\n", c.name.c_str());
      std::printf("%12s %12s %6s | %10s %9s | %10s %9s | %10s %9s | %6s | %5s | %6s\n",
                  "size(B)", "count", "type", "tandem(us)", "busbw", "mpi(us)", "busbw",
                  "mpi_nb(us)", "busbw", "ratio", "goal", "wrong");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= absl::GetFlag(FLAGS_factor)) {
      count = std::max<int64_t>(bytes / 4, 1);
      const int64_t row_bytes = count * 4;
      set_shards(count);
      int64_t wrong = 0;
      if (absl::GetFlag(FLAGS_check)) {
        c.prepare(count);
        c.run_tandem();
        wrong = c.errors();
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, direct);
        all_correct = all_correct && wrong == 0;
      }
      const bool with_tandem = absl::GetFlag(FLAGS_tandem);
      const bool with_mpi = absl::GetFlag(FLAGS_mpi);
      const int tandem_iterations = with_tandem ? Calibrate(c.run_tandem, direct) : 0;
      const int mpi_iterations = with_mpi ? Calibrate(c.run_mpi, direct) : 0;
      const int mpi_nb_iterations = with_mpi ? Calibrate(c.run_mpi_nb, direct) : 0;
      std::vector<double> tandem_rounds, mpi_rounds, mpi_nb_rounds;
      for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_repeats)); ++round) {
        if (with_tandem) tandem_rounds.push_back(TimeRound(c.run_tandem, tandem_iterations, direct));
        if (with_mpi) {
          mpi_rounds.push_back(TimeRound(c.run_mpi, mpi_iterations, direct));
          mpi_nb_rounds.push_back(TimeRound(c.run_mpi_nb, mpi_nb_iterations, direct));
        }
      }
      const double tandem_seconds = Median(tandem_rounds);
      const double mpi_seconds = Median(mpi_rounds);
      const double mpi_nb_seconds = Median(mpi_nb_rounds);
      if (rank == 0) {
        auto busbw = [&](double seconds) {
          return seconds > 0 ? row_bytes / seconds / 1e9 * c.bus_factor : 0.0;
        };
        const double best_mpi = std::max(busbw(mpi_seconds), busbw(mpi_nb_seconds));
        const double ratio = best_mpi > 0 ? busbw(tandem_seconds) / best_mpi : 0.0;
        const char* goal = "-";
        if (with_tandem && with_mpi && (row_bytes >= kBandwidthGoalMinBytes ||
                                        (bytes == min_bytes && row_bytes <= kLatencyGoalMaxBytes))) {
          // Same bytes, so the time ratio is the inverse of the bandwidth ratio.
          const bool met = row_bytes >= kBandwidthGoalMinBytes
                               ? ratio >= kBandwidthGoalRatio
                               : ratio > 0 && 1.0 / ratio <= kLatencyGoalRatio;
          goal = met ? "pass" : "FAIL";
          ++(met ? goals_met : goals_missed);
        }
        std::printf("%12lld %12lld %6s | %10.2f %9.3f | %10.2f %9.3f | %10.2f %9.3f | %6.2f | %5s | "
                    "%6lld\n",
                    static_cast<long long>(row_bytes), static_cast<long long>(count), "float",
                    tandem_seconds * 1e6, busbw(tandem_seconds), mpi_seconds * 1e6,
                    busbw(mpi_seconds), mpi_nb_seconds * 1e6, busbw(mpi_nb_seconds), ratio, goal,
                    static_cast<long long>(wrong));
        std::fflush(stdout);
      }
    }
  }
  if (rank == 0) {
    std::printf("\n# goal (>= %.2fx busbw from %lld B, <= %.1fx time at %lld B): %d rows pass, %d fail\n",
                kBandwidthGoalRatio, static_cast<long long>(kBandwidthGoalMinBytes),
                kLatencyGoalRatio, static_cast<long long>(kLatencyGoalMaxBytes), goals_met,
                goals_missed);
  }
  if (rank == 0) std::printf("\n# data check: %s\n", all_correct ? "all correct" : "ERRORS");
  MPI_Comm_free(&direct);
  created->reset();
  MPI_Finalize();
  return all_correct ? 0 : 1;
}
