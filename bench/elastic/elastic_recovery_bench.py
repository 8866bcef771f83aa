#!/usr/bin/env python3
"""Recovery time of `tandem train --elastic` after a real SIGKILL, beside a restart.

For each kill point, runs `mpirun --enable-recovery -np N tandem train --elastic ...` with
TANDEM_ELASTIC_KILL and prints, from the rank's own timestamps:
  detect+agree  kill -> the survivors' reconfiguration line (heartbeat timeout + agreement)
  re-form       the survivors' own figure for shrink, plan, state moves and new engines
  lost          kill -> end of the first redone iteration, minus one normal iteration
  restart       what a restart costs instead: a fresh mpirun to its first iteration's end
and checks that the run finished with the uninterrupted run's losses. Then the same kill with
--elastic-replace: the job starts a new rank (MPI_Comm_spawn) once the survivors have run one
iteration, and the growth's parts are printed (start and join, re-plan, state copy, engines,
first step after) with the throughput back at full size.

usage: bench/elastic/elastic_recovery_bench.py BUILD_DIR [--ranks 4] [--steps 24]
       [--heartbeat-timeout 2] [--train-flags "--tensor-parallel 2 --sequence-parallel"]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MODEL = ("--model gpt --layers 4 --hidden 64 --heads 4 --seq-len 32 --optimizer adamw "
         "--lr 3e-3 --warmup-steps 2 --global-batch 32 --microbatch-size 2 --seed 11")


HEARTBEAT = 2.0
YIELD = False
EXTRA = []  # --train-flags


def run(build, ranks, steps, kill, memory, log, extra=()):
    env = dict(os.environ)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "--enable-recovery"]
    if YIELD:
        # More processes than cores after a growth: Open MPI's busy polling starves the TCP
        # links between the started ranks and the others (shared memory does not cross jobs).
        cmd += ["--mca", "mpi_yield_when_idle", "1"]
    if kill:
        env["TANDEM_ELASTIC_KILL"] = kill
        cmd += ["-x", "TANDEM_ELASTIC_KILL"]
    cmd += ["-np", str(ranks), os.path.join(build, "bin", "tandem"), "train", "--elastic",
            "--steps", str(steps), "--log-json", log, "--device-memory-mb", str(memory),
            "--heartbeat-timeout", str(HEARTBEAT)]
    cmd += MODEL.split() + EXTRA + list(extra)
    start = time.time()
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600).stdout
    lines = [json.loads(l) for l in open(log) if l.strip()]
    return start, out, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--memory-mb", type=float, default=2.0,
                    help="device memory the templates plan for (small: pipelines of stages)")
    ap.add_argument("--heartbeat-timeout", type=float, default=2.0,
                    help="seconds of silence before a rank is declared dead")
    ap.add_argument("--no-yield", action="store_true",
                    help="growth run without --mca mpi_yield_when_idle 1 (on a host with fewer "
                         "cores than ranks the started rank's TCP links then crawl)")
    ap.add_argument("--train-flags", default="",
                    help="more `tandem train` flags for every run (e.g. '--tensor-parallel 2')")
    args = ap.parse_args()
    global HEARTBEAT, YIELD, EXTRA
    HEARTBEAT = args.heartbeat_timeout
    EXTRA = args.train_flags.split()
    tmp = tempfile.mkdtemp(prefix="tandem_elastic_bench_")

    base_log = os.path.join(tmp, "base.jsonl")
    start, out, lines = run(args.build, args.ranks, args.steps, "", args.memory_mb, base_log)
    iters = [l for l in lines if "iteration" in l and "event" not in l]
    if not iters:
        sys.exit("the run without failures trained nothing:\n" + out)
    layout = re.search(r"elastic: (\d+ pipeline\(s\)[^\n]*)", out)
    restart = iters[0]["unix_time"] - start
    normal = sorted(l["iteration_ms"] for l in iters[1:])[len(iters[1:]) // 2] / 1e3
    reference = {l["iteration"]: l["loss"] for l in iters}
    print(f"tandem train --elastic, {args.ranks} ranks, {MODEL} {args.train_flags}".rstrip())
    print(f"layout: {layout.group(1) if layout else '?'}")
    print(f"restart (mpirun to the end of the first iteration, profiling and templates "
          f"included): {restart:.2f} s; median iteration {normal * 1e3:.1f} ms")
    print(f"{'kill':<18} {'detect':>7} {'agree':>7} {'replan':>7} {'copy':>7} {'build':>7}"
          f" {'1st step':>8} {'total':>7} {'lost':>6} {'lost/restart':>12}  losses  after")
    victim = args.ranks - 1
    third = max(2, args.steps // 3)
    throughput = []
    for point in ["forward", "backward", "sync", "commit"]:
        kill = f"{victim}:{third}:{point}"
        log = os.path.join(tmp, f"{point}.jsonl")
        _, out, lines = run(args.build, args.ranks, args.steps, kill, args.memory_mb, log)
        m = re.search(r"kills itself \(SIGKILL\) at .* \(unix time ([0-9.]+)\)", out)
        recon = [l for l in lines if l.get("event") == "recovery"]
        finished = any(l.get("event") == "finished" for l in lines)
        if not m or not recon or not finished:
            print(f"{kill:<18} did not recover:\n{out}")
            continue
        killed = float(m.group(1))
        r = recon[0]
        first = [l for l in lines if "event" not in l and l["iteration"] == r["resume_iteration"]]
        end_first = first[-1]["unix_time"] if first else float("nan")
        total = end_first - killed
        lost = total - normal
        worst = max(abs(l["loss"] - reference[l["iteration"]]) / abs(reference[l["iteration"]])
                    for l in lines if "event" not in l and l["iteration"] in reference)
        before = sorted(l["iteration_ms"] for l in lines
                        if "event" not in l and 0 < l["iteration"] < r["committed_iteration"])
        after = sorted(l["iteration_ms"] for l in lines
                       if "event" not in l and l["iteration"] > r["resume_iteration"])
        if before and after:
            ratio = before[len(before) // 2] / after[len(after) // 2]
            throughput.append((kill, ratio, len(r["live"]) / args.ranks))
        ms = lambda x: f"{x * 1e3:>5.0f}ms"
        print(f"{kill:<18} {r['detection_seconds']:>6.2f}s {ms(r['agreement_seconds'])} "
              f"{ms(r['shrink_seconds'] + r['replan_seconds'])} {ms(r['state_copy_seconds'])} "
              f"{ms(r['build_seconds'])} {ms(r['first_step_after_seconds'])}  {total:>5.2f}s "
              f"{lost:>5.2f}s {lost / restart:>11.2f}x  "
              f"{'equal' if worst <= 1e-5 else f'differ {worst:.1e}'}  {r['layout']}")
    # Growth: the lost rank replaced live.
    kill = f"{victim}:{third}:forward"
    log = os.path.join(tmp, "replace.jsonl")
    YIELD = not args.no_yield and (os.cpu_count() or 1) < args.ranks + 1
    _, out, lines = run(args.build, args.ranks, args.steps, kill, args.memory_mb, log,
                        ["--elastic-replace"])
    grown = [l for l in lines if l.get("event") == "growth"]
    iters = [l for l in lines if "event" not in l]
    if not grown or not any(l.get("event") == "finished" for l in lines):
        print(f"growth after {kill}: did not grow back:\n{out}")
    else:
        g = grown[0]
        worst = max(abs(l["loss"] - reference[l["iteration"]]) / abs(reference[l["iteration"]])
                    for l in iters if l["iteration"] in reference)
        before = sorted(l["iteration_ms"] for l in iters if 0 < l["iteration"] < third)
        after = sorted(l["iteration_ms"] for l in iters if l["iteration"] > g["resume_iteration"])
        ratio = (before[len(before) // 2] / after[len(after) // 2]) if before and after else 0
        print(f"growth after {kill} (--elastic-replace): rank(s) {g['added']} started and "
              f"joined in {g['spawn_seconds']:.2f} s; re-formed in {g['reform_seconds']:.2f} s "
              f"(re-plan {g['replan_seconds'] * 1e3:.0f} ms, state copy "
              f"{g['state_copy_seconds'] * 1e3:.0f} ms of {g['bytes_moved'] / 1024:.0f} KiB, "
              f"engines {g['build_seconds'] * 1e3:.0f} ms); first step after "
              f"{g['first_step_after_seconds'] * 1e3:.0f} ms; throughput after / before the "
              f"kill {ratio:.2f}; losses {'equal' if worst <= 1e-5 else f'differ {worst:.1e}'}; "
              f"{g['layout']}{' (mpirun --mca mpi_yield_when_idle 1: more ranks than cores)' if YIELD else ''}")
    for kill, ratio, share in throughput:
        print(f"throughput after / before ({kill}): {ratio:.2f} (surviving / initial ranks "
              f"{share:.2f}; goal >= 0.9 x that = {0.9 * share:.2f})")
    print(f"detect: the victim's silence when a survivor declared it dead (heartbeat timeout "
          f"{HEARTBEAT:g} s);"
          " total: kill to the end of the first step after; lost: total less one normal "
          "iteration")


if __name__ == "__main__":
    main()
