#!/usr/bin/env python3
"""Random faults against `tandem train --elastic`: does every run end as the uninterrupted one?

Runs the uninterrupted job once, then N jobs, each with a seeded random fault: one rank (or two
at once, in 30% of the cases) SIGKILLed or SIGSTOPped at a random iteration and point
(TANDEM_ELASTIC_KILL: forward, backward, sync, commit, checkpoint, stop, shrink, export,
reform), or two grow requests (SIGUSR2 to mpirun, as `tandem cluster run` sends them) a random
0-0.6 s apart. For each run it prints the exit status, the iterations logged (each must appear
once), the finished and failed events, the recoveries and growths, and the largest relative
difference of a loss from the uninterrupted run's; the last line counts the runs that ended
well (exit 0, one finished event, no failure, every iteration once, losses within 1e-5).

usage: bench/elastic/random_faults.py BUILD_DIR [--runs 12] [--seed 20261129] [--ranks 4]
Exit status 1 when a run did not end well.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MODEL = ("--model gpt --layers 2 --hidden 16 --heads 2 --seq-len 8 --optimizer adamw "
         "--lr 3e-3 --warmup-steps 2 --weight-decay 0.01 --global-batch 16 "
         "--microbatch-size 2 --seed 11 --device-memory-mb 0.07")
POINTS = ["forward", "backward", "sync", "commit", "checkpoint", "stop", "shrink", "export",
          "reform"]


def run(build, ranks, steps, work, name, kill="", grow_gap=None, extra=""):
    """One job; returns (exit status, the log's lines)."""
    log = os.path.join(work, f"{name}.jsonl")
    checkpoint = os.path.join(work, f"{name}_checkpoint")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "--enable-recovery"]
    if kill:
        env["TANDEM_ELASTIC_KILL"] = kill
        command += ["-x", "TANDEM_ELASTIC_KILL"]
    command += ["-np", str(ranks), os.path.join(build, "bin", "tandem"), "train", "--elastic"]
    command += MODEL.split() + ["--steps", str(steps), "--log-json", log, "--checkpoint-dir",
                                checkpoint, "--checkpoint-every", "2"] + extra.split()
    with open(os.path.join(work, f"{name}.out"), "w") as out:
        job = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
        if grow_gap is not None:
            # Two requests once the job trains, as a scheduler would send them.
            deadline = time.time() + 60
            while time.time() < deadline and job.poll() is None:
                if os.path.exists(log) and '"loss"' in open(log).read():
                    break
                time.sleep(0.05)
            for gap in (0, grow_gap):
                time.sleep(gap)
                if job.poll() is None:
                    job.send_signal(signal.SIGUSR2)
        try:
            status = job.wait(timeout=180)
        except subprocess.TimeoutExpired:
            job.kill()
            status = 124
    lines = []
    if os.path.exists(log):
        for row in open(log):
            try:
                lines.append(json.loads(row))
            except json.JSONDecodeError:
                lines.append({"event": "malformed line"})
    shutil.rmtree(checkpoint, ignore_errors=True)
    return status, lines


def summary(lines):
    losses, repeated = {}, 0
    events = {}
    for line in lines:
        if "event" in line:
            events[line["event"]] = events.get(line["event"], 0) + 1
            continue
        repeated += line["iteration"] in losses
        losses[line["iteration"]] = line["loss"]
    return losses, repeated, events


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="tandem_random_faults_")
    status, lines = run(args.build, args.ranks, args.steps, work, "reference")
    reference, _, _ = summary(lines)
    if status != 0 or len(reference) != args.steps:
        print(f"the uninterrupted run failed (exit {status}); see {work}")
        return 1
    good = 0
    for i in range(args.runs):
        kill, gap, steps = "", None, args.steps
        if rng.random() < 0.25:
            gap = round(rng.uniform(0, 0.6), 2)
            steps = 150  # long enough for two growths
            fault = f"grow requests {gap} s apart"
        else:
            rank = rng.randrange(args.ranks)
            iteration = rng.randint(1, args.steps - 2)
            kill = f"{rank}:{iteration}:{rng.choice(POINTS)}"
            if rng.random() < 0.3:
                other = rng.choice([r for r in range(args.ranks) if r != rank])
                kill += f",{other}:{iteration}:{rng.choice(['forward', 'backward', 'commit'])}"
            fault = kill
        status, lines = run(args.build, args.ranks, steps, work, f"run{i}", kill, gap,
                            "--elastic-min-pipelines 1" if gap is not None else "")
        losses, repeated, events = summary(lines)
        # A longer run (the growth requests) has another learning-rate schedule: no reference.
        worst = float("nan") if gap is not None else max(
            (abs(losses[k] - reference[k]) / abs(reference[k]) for k in losses if k in reference),
            default=float("nan"))
        ok = (status == 0 and events.get("finished", 0) == 1 and "failed" not in events and
              repeated == 0 and len(losses) == steps and
              (gap is not None or worst <= 1e-5))
        good += ok
        print(f"{fault:<36} exit {status:3d}  iterations {len(losses):3d}/{steps}  "
              f"repeated {repeated}  finished {events.get('finished', 0)}  "
              f"failed {events.get('failed', 0)}  recoveries {events.get('recovery', 0)}  "
              f"growths {events.get('growth', 0)}  worst loss difference {worst:.1e}  "
              f"{'ok' if ok else 'NOT OK'}", flush=True)
    print(f"{good} of {args.runs} runs ended as the uninterrupted run (logs in {work})")
    if good == args.runs:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if good == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
