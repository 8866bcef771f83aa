#!/usr/bin/env python3
"""tandem's Piper planner against Piper's own optimiser (msr-fiddle/piper, algo.cpp).

Runs `tandem plan --algorithm piper` and a build of Piper's algo.cpp on the same inputs, device
counts, memory, micro-batches and bandwidth; checks that both reach the same optimal time per
sample (within --tolerance, or both find no plan) and prints, per configuration, the median
wall time of one invocation of each program (process start-up included) and the time of the
algorithm alone as each program reports it.

Piper is not part of tandem: fetch msr-fiddle/piper yourself and build its algo.cpp with the
small command-line driver this script prints (`--print-build`); algo.cpp's own main() runs the
paper's experiments and takes no arguments. Pass the binary with --piper.

  bench/planner/piper_compare.py --print-build > piper_driver.cc   # then follow its header
  bench/planner/piper_compare.py --piper /tmp/piper/piper_algo [--tandem build/bin/tandem]

Both programs read the same input file (by default tandem's copy of Piper's
inputs/bert32a100.json). tandem runs Piper's greedy knapsack (--knapsack greedy), as
algo.cpp does.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = float(1 << 30)

DRIVER = r'''// piper_driver.cc: a command-line main() around Piper's algo.cpp (msr-fiddle/piper), whose
// own main() runs the paper's experiments. Build, with algo.cpp and nlohmann/ from Piper beside
// this file:
//   g++ -O3 -std=c++17 -I. piper_driver.cc -o piper_algo
// Run: piper_algo INPUT.json [--devices K] [--memory-bytes M] [--microbatches N]
//                            [--bandwidth B]
// Prints "time_per_sample X devices K stages P algorithm_seconds T" (or "infeasible ...",
// exit 3). The algorithm time covers Graph construction and runDP(), as Piper's experiments
// time it.
#define main piper_paper_main
#include "algo.cpp"
#undef main
#include <chrono>
#include <cstring>

int main(int argc, char** argv) {
  if (argc < 2) {
    cerr << "usage: piper_algo INPUT.json [--devices K] [--memory-bytes M] "
            "[--microbatches N] [--bandwidth B]\n";
    return 2;
  }
  json j;
  ifstream in(argv[1]);
  if (!in) {
    cerr << "cannot read " << argv[1] << "\n";
    return 2;
  }
  in >> j;
  Instance ins = j.get<Instance>();
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--devices")) ins.maxDevices = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--memory-bytes")) ins.maxMemoryPerDevice = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--microbatches")) ins.mbsInBatch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bandwidth")) ins.bandwidth = atof(argv[i + 1]);
    else {
      cerr << "unknown flag " << argv[i] << "\n";
      return 2;
    }
  }
  const auto start = chrono::steady_clock::now();
  Graph g(ins);
  Result result = g.runDP();
  const double seconds = chrono::duration<double>(chrono::steady_clock::now() - start).count();
  if (result.stages.empty()) {
    cout << "infeasible algorithm_seconds " << seconds << endl;
    return 3;
  }
  int devices = 0;
  for (const ResultStage& s : result.stages) {
    devices += s.dataParallelDegree * s.tensorParallelDegree;
  }
  cout << setprecision(12) << "time_per_sample " << g.getTPSForResult(result) << " devices "
       << devices << " stages " << result.stages.size() << " algorithm_seconds " << seconds
       << endl;
  return 0;
}
'''

BUILD_HELP = '''// How to build Piper's optimiser with this driver (nothing is fetched for you):
//   git clone https://github.com/msr-fiddle/piper && cd piper   # tested at d7fc8cf
//   bench/planner/piper_compare.py --print-build > piper_driver.cc   # this file
//   g++ -O3 -std=c++17 -I. piper_driver.cc -o piper_algo
//   bench/planner/piper_compare.py --piper $PWD/piper_algo
'''


# (label, devices, memory bytes or None for the file's, micro-batches, bandwidth bytes/s or
# None). Piper's experiments (algo.cpp: single(), plots(), scalability()) use 25 GiB/s,
# 1920 micro-batches and 1, 2, 8 or 80 GiB; the input file itself says 80e9 bytes, 25e9 B/s.
def default_configs(full):
    configs = []
    for k in (1, 2, 4, 8, 16, 32, 64):
        configs.append(("file settings", k, None, 1920, None))
    for k in (8, 32, 64, 128, 512):
        configs.append(("8 GiB, 25 GiB/s", k, 8 * GIB, 1920, 25 * GIB))
    for k in (8, 64):
        configs.append(("2 GiB, 25 GiB/s", k, 2 * GIB, 1920, 25 * GIB))
    configs.append(("80 GiB, 25 GiB/s", 512, 80 * GIB, 1920, 25 * GIB))
    configs.append(("file settings, 512 mb", 64, None, 512, None))
    configs.append(("file settings, 512 mb", 512, None, 512, None))
    if full:
        configs.append(("8 GiB, 25 GiB/s", 1024, 8 * GIB, 1920, 25 * GIB))
        configs.append(("file settings, 2048 mb", 1024, None, 2048, None))
    return configs


def run_timed(argv):
    """Wall and processor seconds of one invocation (spawn to exit), exit code, stdout."""
    with tempfile.TemporaryFile() as out, open(os.devnull, "wb") as null:
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                                           (os.POSIX_SPAWN_DUP2, null.fileno(), 2)])
        _, status, usage = os.wait4(pid, 0)
        seconds = time.perf_counter() - start
        out.seek(0)
        return (seconds, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status),
                out.read().decode())


UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def parse_tandem(code, text):
    if code != 0:
        return None, None, None
    load = re.search(r"maximum load \(time per sample\) (\S+) s using (\d+) devices", text)
    planned = re.search(r"planned in ([0-9.]+) (ns|us|ms|s|min)", text)
    algorithm = float(planned.group(1)) * UNITS[planned.group(2)] if planned else None
    return float(load.group(1)), int(load.group(2)), algorithm


def parse_piper(code, text):
    seconds = re.search(r"algorithm_seconds (\S+)", text)
    algorithm = float(seconds.group(1)) if seconds else None
    if code != 0:
        return None, None, algorithm
    load = re.search(r"time_per_sample (\S+) devices (\d+)", text)
    return float(load.group(1)), int(load.group(2)), algorithm


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--piper", help="Piper's algo.cpp built with the driver (--print-build)")
    parser.add_argument("--tandem", default=os.path.join(REPO, "build", "bin", "tandem"))
    parser.add_argument("--input", default=os.path.join(REPO, "tests", "data", "piper",
                                                        "bert32a100.json"))
    parser.add_argument("--repeats", type=int, default=7, help="runs per program and row")
    parser.add_argument("--tolerance", type=float, default=1e-6,
                        help="relative difference allowed between the optima")
    parser.add_argument("--full", action="store_true", help="also 1,024 devices (slow in Piper)")
    parser.add_argument("--devices", type=int, nargs="*",
                        help="only rows with these device counts")
    parser.add_argument("--print-build", action="store_true",
                        help="print how to build Piper's algo.cpp with a command-line driver")
    args = parser.parse_args()
    if args.print_build:
        sys.stdout.write(BUILD_HELP + "\n" + DRIVER)
        return 0
    if not args.piper:
        parser.error("--piper BINARY is required (see --print-build)")
    for path in (args.piper, args.tandem, args.input):
        if not os.path.exists(path):
            parser.error(f"{path}: not found")
    piper = os.path.abspath(args.piper)
    tandem = os.path.abspath(args.tandem)

    print(f"input {os.path.relpath(args.input, REPO)}; median of {args.repeats} runs each; "
          "wall time per invocation (start-up included) and the algorithm alone")
    print("wall: spawn to exit; cpu: user + system time of the process; alg: the algorithm "
          "as each program times it")
    header = (f"{'configuration':<22} {'devices':>7} {'Piper ms':>9} {'tandem ms':>9} "
              f"{'speedup':>7} {'cpu':>6} {'Piper alg':>10} {'tandem alg':>10} {'alg':>6}  "
              f"time per sample (Piper / tandem)")
    print(header)
    print("-" * len(header))
    worst = float("inf")
    disagreements = 0
    for label, devices, memory, microbatches, bandwidth in default_configs(args.full):
        if args.devices and devices not in args.devices:
            continue
        piper_argv = [piper, args.input, "--devices", str(devices), "--microbatches",
                      str(microbatches)]
        tandem_argv = [tandem, "plan", "--profile", args.input, "--profile-format", "piper",
                       "--algorithm", "piper", "--knapsack", "greedy", "--devices", str(devices),
                       "--microbatches", str(microbatches)]
        if memory is not None:
            piper_argv += ["--memory-bytes", repr(memory)]
            tandem_argv += ["--memory", str(int(memory))]
        if bandwidth is not None:
            piper_argv += ["--bandwidth", repr(bandwidth)]
            tandem_argv += ["--bandwidth", str(int(bandwidth))]
        walls = {"piper": [], "tandem": []}
        cpus = {"piper": [], "tandem": []}
        algorithms = {"piper": [], "tandem": []}
        results = {}
        # Alternate the programs so that both see the same machine load.
        for _ in range(args.repeats):
            for name, argv, parse in (("piper", piper_argv, parse_piper),
                                      ("tandem", tandem_argv, parse_tandem)):
                seconds, cpu, code, text = run_timed(argv)
                load, used, algorithm = parse(code, text)
                walls[name].append(seconds)
                cpus[name].append(cpu)
                if algorithm is not None:
                    algorithms[name].append(algorithm)
                results[name] = (load, used)
        piper_load, tandem_load = results["piper"][0], results["tandem"][0]
        if piper_load is None and tandem_load is None:
            agree, loads = True, "no plan fits / no plan fits"
        elif piper_load is None or tandem_load is None:
            agree, loads = False, f"{piper_load} / {tandem_load}"
        else:
            agree = abs(piper_load - tandem_load) <= args.tolerance * max(piper_load, tandem_load)
            loads = (f"{piper_load:.9g} ({results['piper'][1]} dev) / "
                     f"{tandem_load:.9g} ({results['tandem'][1]} dev)")
        if not agree:
            disagreements += 1
            loads += "  DISAGREE"
        piper_ms = statistics.median(walls["piper"]) * 1e3
        tandem_ms = statistics.median(walls["tandem"]) * 1e3
        speedup = piper_ms / tandem_ms
        cpu_speedup = statistics.median(cpus["piper"]) / max(statistics.median(cpus["tandem"]),
                                                             1e-6)
        worst = min(worst, speedup)
        piper_alg = statistics.median(algorithms["piper"]) * 1e3 if algorithms["piper"] else None
        tandem_alg = (statistics.median(algorithms["tandem"]) * 1e3
                      if algorithms["tandem"] else None)
        alg_speedup = (f"{piper_alg / tandem_alg:5.0f}x"
                       if piper_alg and tandem_alg else f"{'-':>6}")
        fmt = lambda v: f"{v:.2f}" if v is not None else "-"
        print(f"{label:<22} {devices:>7} {piper_ms:>9.2f} {tandem_ms:>9.2f} {speedup:>6.1f}x "
              f"{cpu_speedup:>5.1f}x {fmt(piper_alg):>10} {fmt(tandem_alg):>10} {alg_speedup}  "
              f"{loads}", flush=True)
    print(f"slowest row: {worst:.1f}x (goal: at least 5x on every row); "
          f"{disagreements} disagreement(s)")
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
