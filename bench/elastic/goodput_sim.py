#!/usr/bin/env python3
"""Goodput against failure frequency: tandem's measured recovery beside Oobleck, Varuna, Bamboo.

An event-driven simulation over Oobleck's published failure traces
(tests/data/oobleck_traces: 30 nodes, one node lost every 5 min ... 6 h). One job runs on the
trace's nodes; every system trains it at the same speed, and they differ only in what a
failure costs:

  tandem   a pause of --tandem-recovery-s (measured: kill to the end of the first step after
           it, heartbeat timeout 1 s) and the interrupted iteration, which is redone
  oobleck  a pause of the reconfiguration time Oobleck's simulator assumes, and the
           interrupted iteration
  varuna   rolls back to its last checkpoint and restarts; it checkpoints every 10 of the
           simulated model's iterations (as a time), and checkpoint writes pause training
  bamboo   finishes the interrupted iteration on its redundant copy, slower, then
           reconfigures; a second failure before that is a restart

The Oobleck, Varuna and Bamboo costs are those of Oobleck's simulator
(SymbioticLab/Oobleck @ 7966556, tools/simulator) for --model; the program prints each value
with its file and line. Throughput is proportional to the live nodes (iteration time
--iteration-s x N / live), the same for every system, so the figures isolate failure handling.

Printed per trace and system: failures, time lost (interrupted or rolled-back work, recovery
pauses, checkpoint writes, slowed iterations), goodput = useful training time / wall time,
the work done relative to a run without failures and relative to "free", a system whose
recovery costs nothing (it only loses the dead nodes' throughput); then goodput with the
traces' inter-failure times scaled by --scales. The run ends one mean inter-failure gap after
the last failure, so every failure's cost falls inside it. The traces are periodic, so each
failure is moved by a random share of the iteration it interrupts and the figures are means
over --phase-samples such copies (0: the exact times). Nodes that join later are not used.

usage: bench/elastic/goodput_sim.py [--model BERT-large] [--traces 5m,10m,...|FILE.csv,...]
       [--tandem-recovery-s 1.3] [--iteration-s 1.0] [--scales 0.25,0.5,1,2,4]
       [--bamboo-redundancy 0] [--phase-samples 16] [--format table|json]
       bench/elastic/goodput_sim.py --self-check
"""
import argparse
import csv
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data", "oobleck_traces"))
DEFAULT_TRACES = ["5m", "10m", "30m", "1h", "3h", "6h"]
SIM = "SymbioticLab/Oobleck @ 7966556 (branch sosp23-artifact), tools/simulator/"
EPS = 1e-9

# Costs in Oobleck's simulator, seconds, per model. The iteration times are the simulator's
# samples per step over its throughput on 30 nodes; Varuna checkpoints every 10 of its own
# iterations (varuna_simulator.py:118, the default eval_tput_vs_freq.py keeps).
MODELS = {
    "BERT-large": dict(
        oobleck_reconfig=(2.0, "oobleck_simulator.py:253"),
        varuna_restart=(71.3, "varuna_simulator.py:493 (30 nodes; 49.1-112 s by node count, "
                              ":492-539)"),
        varuna_ckpt=(15.8, "varuna_simulator.py:278"),
        varuna_iter=(23.87, "varuna_simulator.py:266,471 (8192 samples / 343.1 per s)"),
        bamboo_reconfig=(76.0, "bamboo_simulator.py:255"),
        oobleck_iter=(22.25, "oobleck_simulator.py:245,408 (8192 / 368.2 per s)")),
    "GPT-2-ours": dict(
        oobleck_reconfig=(2.0, "oobleck_simulator.py:266"),
        varuna_restart=(83.0, "varuna_simulator.py:297"),
        varuna_ckpt=(11.5, "varuna_simulator.py:298"),
        varuna_iter=(8.14, "varuna_simulator.py:289,577 (1024 / 125.8 per s)"),
        bamboo_reconfig=(80.0, "bamboo_simulator.py:266"),
        oobleck_iter=(9.31, "oobleck_simulator.py:259,473 (1024 / 110.0 per s)")),
    "GPT-3-medium": dict(
        oobleck_reconfig=(3.0, "oobleck_simulator.py:282"),
        varuna_restart=(78.7, "varuna_simulator.py:315"),
        varuna_ckpt=(11.2, "varuna_simulator.py:316"),
        varuna_iter=(19.50, "varuna_simulator.py:310,666 (819 / 42.0 per s)"),
        bamboo_reconfig=(100.0, "bamboo_simulator.py:278"),
        bamboo_oom="bamboo_simulator.py:581",
        oobleck_iter=(21.29, "oobleck_simulator.py:275,538 (819 / 38.5 per s)")),
    "GPT-3-2_7b": dict(
        oobleck_reconfig=(6.0, "oobleck_simulator.py:295"),
        varuna_restart=(515.0, "varuna_simulator.py:331"),
        varuna_ckpt=(50.0, "varuna_simulator.py:332"),
        varuna_iter=(52.42, "varuna_simulator.py:326,755 (512 / 9.77 per s)"),
        bamboo_reconfig=(230.0, "bamboo_simulator.py:290"),
        bamboo_oom="bamboo_simulator.py:652",
        oobleck_iter=(55.57, "oobleck_simulator.py:289,603 (512 / 9.21 per s)")),
    "GPT-3-6_7b": dict(
        oobleck_reconfig=(10.0, "oobleck_simulator.py:307"),
        varuna_restart=(701.0, "varuna_simulator.py:347"),
        varuna_ckpt=(120.0, "varuna_simulator.py:348"),
        varuna_iter=(195.40, "varuna_simulator.py:342,844 (1024 / 5.24 per s)"),
        bamboo_reconfig=(450.0, "bamboo_simulator.py:302"),
        bamboo_oom="bamboo_simulator.py:723",
        oobleck_iter=(185.92, "oobleck_simulator.py:302,668 (1024 / 5.51 per s)")),
}
VARUNA_CKPT_EVERY = 10        # iterations, varuna_simulator.py:118
BAMBOO_SLOWDOWN = 1.5         # bamboo_simulator.py:225
BAMBOO_RESTART = 30.0         # bamboo_simulator.py:212, global rendezvous after a fatal failure
BAMBOO_SIM_REDUNDANCY = 0.8029  # bamboo_simulator.py:128, 1 - 0.1971 (its time breakdown)


class Policy:
    """What a failure costs a system (seconds)."""

    def __init__(self, name, pause, note, source, fatal_pause=None, slowdown=None,
                 ckpt_interval=None, ckpt_write=0.0, ckpt_after_restart=False, redundancy=0.0):
        self.name, self.pause, self.note, self.source = name, pause, note, source
        self.fatal_pause = fatal_pause    # Bamboo: pause after a failure it cannot absorb
        self.slowdown = slowdown          # Bamboo: rest of the interrupted iteration, slower
        self.ckpt_interval = ckpt_interval  # Varuna: seconds of training between checkpoints
        self.ckpt_write = ckpt_write
        self.ckpt_after_restart = ckpt_after_restart
        self.redundancy = redundancy      # share of each iteration spent on redundant work


def simulate(p, n0, failures, horizon, it0):
    """Runs one job under policy p. failures: sorted [(time_s, nodes_lost)].

    Returns the time spent in each state (they add up to horizon) and the iterations done
    (fractional at the horizon). An iteration is nominal = it0 * n0 / live seconds of useful
    work; with redundancy it takes nominal / (1 - redundancy).
    """
    acc = dict(useful=0.0, lost_work=0.0, paused=0.0, ckpt=0.0, slowed=0.0, redundant=0.0,
               dead=0.0)
    unc = dict(useful=0.0, redundant=0.0, iters=0.0, train=0.0)  # since the last checkpoint
    iters, n, fi, nfail = 0.0, n0, 0, 0
    ckpt_due = False                  # Varuna: checkpoint after the first step after a restart

    def durations():
        nominal = it0 * n0 / n
        return nominal, nominal / (1.0 - p.redundancy)

    def complete(m):
        nonlocal iters
        iters += m
        for d in (acc, unc):
            d["useful"] += m * nominal
            d["redundant"] += m * (dur - nominal)
        unc["iters"] += m
        unc["train"] += m * dur

    mode, start = "train", 0.0
    nominal, dur = durations()
    end = dur
    cur_pause = 0.0
    fb_t = 0.0                        # Bamboo: when the interrupted iteration slowed down
    while True:
        tf = failures[fi][0] if fi < len(failures) else math.inf
        if min(end, tf) >= horizon:
            break
        if end <= tf:                 # the phase ends first (a tie: it ends, then the failure)
            t = end
            if mode == "train":
                # Whole iterations up to the next failure or the horizon, at once.
                m = max(1, int((min(tf, horizon) - start) / dur + EPS))
                if p.ckpt_interval is not None:
                    m = 1 if ckpt_due else min(
                        m, max(1, math.ceil((p.ckpt_interval - unc["train"]) / dur - EPS)))
                complete(m)
                t = start + m * dur
            elif mode == "fallback":
                complete(1)
                acc["slowed"] += (end - fb_t) * (1.0 - 1.0 / p.slowdown)
                mode, start, cur_pause = "pause", t, p.pause   # Bamboo reconfigures
                end = t + cur_pause
                continue
            elif mode == "ckpt":
                acc["ckpt"] += end - start
                unc = dict.fromkeys(unc, 0.0)
            elif mode == "pause":
                acc["paused"] += end - start
                nominal, dur = durations()
            if mode == "train" and p.ckpt_interval is not None and (
                    ckpt_due or unc["train"] >= p.ckpt_interval - EPS):
                ckpt_due = False
                mode, start, end = "ckpt", t, t + p.ckpt_write
            else:
                mode, start, end = "train", t, t + dur
            continue

        # A failure.
        t, k = failures[fi]
        fi += 1
        nfail += k
        n -= k
        pause = p.pause
        if mode == "train":
            if p.slowdown and k == 1 and n > 0:   # Bamboo absorbs it on the redundant copy
                mode, fb_t = "fallback", t
                end = t + (end - t) * p.slowdown
                continue
            acc["lost_work"] += t - start
        elif mode == "fallback":      # Bamboo: a second failure before it reconfigured
            acc["lost_work"] += t - start
            pause = p.fatal_pause
        elif mode == "ckpt":          # the checkpoint being written is lost
            acc["ckpt"] += t - start
        elif mode == "pause":         # recovery starts over
            acc["paused"] += t - start
            pause = cur_pause
        if p.ckpt_interval is not None:   # Varuna: back to the last checkpoint
            acc["lost_work"] += unc["train"]
            acc["useful"] -= unc["useful"]
            acc["redundant"] -= unc["redundant"]
            iters -= unc["iters"]
            unc = dict.fromkeys(unc, 0.0)
            ckpt_due = p.ckpt_after_restart
        if n <= 0:
            acc["dead"] += horizon - t
            mode = "dead"
            break
        mode, start, cur_pause = "pause", t, pause
        end = t + pause

    # The phase in progress at the horizon.
    if mode == "train":
        frac = (horizon - start) / dur
        complete(frac)
    elif mode == "fallback":
        frac = ((fb_t - start) + (horizon - fb_t) / p.slowdown) / dur
        complete(frac)
        acc["slowed"] += (horizon - fb_t) * (1.0 - 1.0 / p.slowdown)
    elif mode == "ckpt":
        acc["ckpt"] += horizon - start
    elif mode == "pause":
        acc["paused"] += horizon - start
    total = sum(acc.values())
    assert abs(total - horizon) < 1e-6 * max(1.0, horizon), (p.name, total, horizon)
    return dict(acc, iterations=iters, failures=nfail)


def ideal_iterations(n0, failures, horizon, it0):
    """Iterations of a system whose recovery is free: only the dead nodes' throughput goes."""
    work, t, n = 0.0, 0.0, n0
    for tf, k in failures:
        if tf >= horizon:
            break
        work += n * (tf - t)
        t, n = tf, n - k
    work += max(0, n) * (horizon - t)
    return work / (n0 * it0)


def load_trace(spec):
    """Returns (name, n0, [(t_s, nodes_lost)], ignored joins). Times from the first event."""
    path = spec if spec.endswith(".csv") else os.path.join(TRACE_DIR, spec + ".csv")
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path, newline="") as f:
        rows = [(int(r[0]) / 1000.0, r[1], r[2]) for r in csv.reader(f) if r]
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    job = {node for t, ev, node in rows if t == t0 and ev == "add"}
    losses, joins = {}, 0
    for t, ev, node in rows:
        if ev == "remove" and node in job:
            job.discard(node)
            losses[t - t0] = losses.get(t - t0, 0) + 1
        elif ev == "add" and t > t0:
            joins += 1                # nodes that join later are not used (tandem cannot grow)
        elif ev not in ("add", "remove"):
            raise ValueError(f"{path}: unknown event {ev!r}")
    n0 = sum(1 for t, ev, node in rows if t == t0 and ev == "add")
    return name, n0, sorted(losses.items()), joins


def horizon_of(failures, n0):
    """The last failure plus the mean gap between failures (from the start), or the moment
    the last node dies."""
    if not failures:
        return 3600.0
    lost = 0
    for t, k in failures:
        lost += k
        if lost >= n0:
            return t
    last = failures[-1][0]
    return last + last / len(failures)


def policies(args):
    m = MODELS[args.model]
    v_restart, v_ckpt = m["varuna_restart"][0], m["varuna_ckpt"][0]
    v_interval = VARUNA_CKPT_EVERY * m["varuna_iter"][0]
    out = [
        Policy("tandem", args.tandem_recovery_s,
               f"pause {args.tandem_recovery_s:g} s + the interrupted iteration (redone)",
               "measured, bench/elastic/elastic_recovery_bench.py (--tandem-recovery-s)"),
        Policy("oobleck", m["oobleck_reconfig"][0],
               f"pause {m['oobleck_reconfig'][0]:g} s + the interrupted iteration",
               f"{m['oobleck_reconfig'][1]}; oobleck_simulator.py:207 (global 0 s), :884-888, "
               ":1015-1023"),
        Policy("varuna", v_restart - v_ckpt,
               f"back to the last checkpoint; restart {v_restart - v_ckpt:g} s, then a "
               f"checkpoint after the first step (= {v_restart:g} s in all); a {v_ckpt:g} s "
               f"checkpoint every {v_interval:.1f} s of training ({VARUNA_CKPT_EVERY} x "
               f"{m['varuna_iter'][0]:g} s)",
               f"restart {m['varuna_restart'][1]}, checkpoint {m['varuna_ckpt'][1]}, "
               f"iteration {m['varuna_iter'][1]}; varuna_simulator.py:118, :1066-1071 "
               "(restart minus checkpoint), :1222-1243 (roll-back), :1465-1484",
               ckpt_interval=v_interval, ckpt_write=v_ckpt, ckpt_after_restart=True),
    ]
    if "bamboo_oom" not in m:
        red = args.bamboo_redundancy
        out.append(Policy(
            "bamboo", m["bamboo_reconfig"][0],
            f"rest of the interrupted iteration {BAMBOO_SLOWDOWN:g}x slower, then reconfigure "
            f"{m['bamboo_reconfig'][0]:g} s; a second failure before that: lost iteration + "
            f"restart {BAMBOO_RESTART:g} s" + (f"; {red:.0%} of each iteration redundant"
                                               if red else ""),
            f"{m['bamboo_reconfig'][1]}; bamboo_simulator.py:212 (restart), :225 (slowdown), "
            ":1059-1104, :1257-1267, :1227-1249",
            fatal_pause=BAMBOO_RESTART, slowdown=BAMBOO_SLOWDOWN, redundancy=red))
    return out


def jittered(n0, failures, it0, rng):
    """Each failure moved later by a uniform share of the iteration it may interrupt, so it
    lands at a random point of that iteration (the traces are periodic: exact times would lock
    every failure to the same phase)."""
    out, n = [], n0
    for t, k in failures:
        out.append((t + rng.random() * it0 * n0 / max(n, 1), k))
        n -= k
    return sorted(out)


def evaluate(pols, n0, failures, horizon, it0, samples):
    """Mean figures per system over `samples` jittered copies of the trace (the same copies
    for every system), or on the exact trace when samples is 0."""
    copies = ([jittered(n0, failures, it0, random.Random(s)) for s in range(samples)]
              if samples > 0 else [failures])
    ff = horizon / it0                # iterations of the job without failures
    ideals = [ideal_iterations(n0, fl, horizon, it0) for fl in copies]
    rows = []
    for p in pols:
        acc = {}
        for fl, ideal in zip(copies, ideals):
            r = simulate(p, n0, fl, horizon, it0)
            for key, v in (("failures", r["failures"]), ("lost_s", horizon - r["useful"]),
                           ("lost_work_s", r["lost_work"]), ("paused_s", r["paused"]),
                           ("checkpoint_s", r["ckpt"]),
                           ("slowed_s", r["slowed"] + r["redundant"]),
                           ("goodput", r["useful"] / horizon),
                           ("vs_no_failures", r["iterations"] / ff),
                           ("vs_free_recovery", r["iterations"] / ideal)):
                acc[key] = acc.get(key, 0.0) + v / len(copies)
        acc["failures"] = round(acc["failures"])
        rows.append(dict(system=p.name, **acc))
    rows.append(dict(system="free", failures=rows[0]["failures"], lost_s=0.0, lost_work_s=0.0,
                     paused_s=0.0, checkpoint_s=0.0, slowed_s=0.0, goodput=1.0,
                     vs_no_failures=sum(ideals) / len(ideals) / ff, vs_free_recovery=1.0))
    return rows


def run_all(args):
    pols = policies(args)
    m = MODELS[args.model]
    res = dict(model=args.model, source=SIM, iteration_s=args.iteration_s,
               phase_samples=args.phase_samples,
               throughput="proportional to the live nodes, the same for every system",
               systems=[dict(name=p.name, per_failure=p.note, source=p.source) for p in pols],
               traces=[], sweep=[], notes=[])
    if "bamboo_oom" in m:
        res["notes"].append(f"bamboo left out: out of memory for {args.model} in the simulator "
                            f"(throughput 0, {m['bamboo_oom']})")
    if args.bamboo_redundancy == 0 and "bamboo_oom" not in m:
        res["notes"].append(
            "bamboo's redundant computation is not charged (--bamboo-redundancy 0); the "
            f"simulator's time breakdown counts {BAMBOO_SIM_REDUNDANCY:.2%} of its step time as "
            "redundant (bamboo_simulator.py:128)")
    res["notes"].append(
        f"the simulator's {args.model} iteration on 30 nodes is {m['oobleck_iter'][0]:g} s "
        f"({m['oobleck_iter'][1]}); --iteration-s {m['oobleck_iter'][0]:g} uses it")
    for spec in args.traces:
        name, n0, failures, joins = load_trace(spec)
        if joins:
            res["notes"].append(f"{name}: {joins} nodes that join later are not used")
        for scale in args.scales + ([] if 1.0 in args.scales else [1.0]):
            fl = [(t * scale, k) for t, k in failures]
            horizon = horizon_of(fl, n0)
            if sum(k for t, k in fl) >= n0 and scale == args.scales[0]:
                res["notes"].append(f"{name}: every node is gone at {fmt_time(horizon / scale)}; "
                                    "the run ends there")
            rows = evaluate(pols, n0, fl, horizon, args.iteration_s, args.phase_samples)
            entry = dict(trace=name, nodes=n0, scale=scale, wall_s=horizon,
                         mtbf_s=fl[-1][0] / len(fl) if fl else None,
                         systems=rows)
            if scale == 1.0:
                res["traces"].append(entry)
            if scale in args.scales:
                res["sweep"].append(entry)
    return res


def fmt_time(s):
    if s is None:
        return "-"
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def print_table(res):
    print(f"goodput_sim: {res['model']}; Oobleck's, Varuna's and Bamboo's costs from {res['source']}")
    print(f"one job for every system: iteration {res['iteration_s']:g} s on all the trace's "
          f"nodes, throughput {res['throughput']}")
    print("failures land at a random point of an iteration: means over "
          f"{res['phase_samples']} copies of each trace" if res["phase_samples"] > 0 else
          "failures at the trace's exact times")
    for s in res["systems"]:
        print(f"  {s['name']:<8} {s['per_failure']}")
        print(f"  {'':<8}   source: {s['source']}")
    for n in res["notes"]:
        print(f"  note: {n}")
    print()
    print("per trace (goodput = useful training time / wall time; vs no-fail: work done / work "
          "of the job without failures;")
    print("vs free: work done / work of a system whose recovery is free; lost = wall - useful "
          "time, of which: redone or rolled-back")
    print("work, recovery pauses, checkpoint writes, slowed iterations and redundant work)")
    head = (f"{'trace':<6} {'MTBF':>9} {'wall':>8} {'system':<8} {'fails':>5} {'goodput':>8} "
            f"{'vs no-fail':>10} {'vs free':>8} {'lost s':>9} {'work':>8} {'pauses':>9} "
            f"{'ckpt':>8} {'slowed':>7}")
    print(head)
    print("-" * len(head))
    for e in res["traces"]:
        for i, r in enumerate(e["systems"]):
            lead = (f"{e['trace']:<6} {fmt_time(e['mtbf_s']):>9} {fmt_time(e['wall_s']):>8}"
                    if i == 0 else " " * 25)
            print(f"{lead} {r['system']:<8} {r['failures']:>5} {r['goodput']:>8.4f} "
                  f"{r['vs_no_failures']:>10.4f} {r['vs_free_recovery']:>8.4f} "
                  f"{r['lost_s']:>9.1f} {r['lost_work_s']:>8.1f} {r['paused_s']:>9.1f} "
                  f"{r['checkpoint_s']:>8.1f} {r['slowed_s']:>7.1f}")
    print()
    names = [s["name"] for s in res["systems"]]
    print("goodput against failure frequency (the traces' inter-failure times scaled)")
    head = f"{'trace':<6} {'scale':>6} {'MTBF':>9} " + " ".join(f"{n:>8}" for n in names)
    print(head)
    print("-" * len(head))
    for e in res["sweep"]:
        print(f"{e['trace']:<6} {e['scale']:>6g} {fmt_time(e['mtbf_s']):>9} "
              + " ".join(f"{r['goodput']:>8.4f}" for r in e["systems"] if r["system"] != "free"))


def self_check():
    """A 4-node job, 1 s iterations, horizon 20 s; goodputs computed by hand."""
    def check(label, got, want):
        ok = abs(got - want) < 1e-9
        print(f"  {label:<44} {got:.6f} (hand: {want:.6f}) {'ok' if ok else 'MISMATCH'}")
        return ok

    tandem = Policy("tandem", 1.3, "", "")
    oobleck = Policy("oobleck", 2.0, "", "")
    varuna = Policy("varuna", 2.0, "", "", ckpt_interval=3.5, ckpt_write=1.0,
                    ckpt_after_restart=True)
    bamboo = Policy("bamboo", 3.0, "", "", fatal_pause=2.0, slowdown=1.5)
    ok = True
    print("self-check: 4 nodes, iteration 1 s, wall 20 s")
    one = [(12.5, 1)]
    # tandem: iteration 12 lost at 12.5 (0.5 s), pause to 13.8, then 6.2 s at 3 nodes.
    r = simulate(tandem, 4, one, 20.0, 1.0)
    ok &= check("one failure at 12.5 s: tandem goodput", r["useful"] / 20, (12 + 6.2) / 20)
    ok &= check("  tandem work vs no failures", r["iterations"] / 20, (12 + 6.2 * 0.75) / 20)
    ok &= check("  free recovery work vs no failures", ideal_iterations(4, one, 20.0, 1.0) / 20,
                (12.5 + 7.5 * 0.75) / 20)
    r = simulate(oobleck, 4, one, 20.0, 1.0)
    ok &= check("  oobleck goodput (pause 2 s)", r["useful"] / 20, (12 + 5.5) / 20)
    # varuna: checkpoints at 4-5 and 9-10 s; 10-12.5 rolled back; restart to 14.5; one
    # iteration of 4/3 s; checkpoint to 16.83; then 3.17 s of training.
    r = simulate(varuna, 4, one, 20.0, 1.0)
    ok &= check("  varuna goodput (ckpt 1 s per 3.5 s, restart 2 s)", r["useful"] / 20, 12.5 / 20)
    ok &= check("  varuna lost work", r["lost_work"], 2.5)
    ok &= check("  varuna checkpoint time", r["ckpt"], 3.0)
    # bamboo: the last 0.5 s of iteration 12 takes 0.75 s (to 13.25), reconfigure 3 s to
    # 16.25, then 3.75 s at 3 nodes.
    r = simulate(bamboo, 4, one, 20.0, 1.0)
    ok &= check("  bamboo goodput (slowdown 1.5, reconfigure 3 s)", r["useful"] / 20,
                16.75 / 20)
    two = [(12.5, 1), (13.0, 1)]
    # tandem: pause restarts at 13.0 and ends at 14.3; then 5.7 s at 2 nodes.
    r = simulate(tandem, 4, two, 20.0, 1.0)
    ok &= check("second failure during recovery: tandem", r["useful"] / 20, (12 + 5.7) / 20)
    # bamboo: the second failure hits the slowed iteration: 12-13 lost, restart 2 s to 15.
    r = simulate(bamboo, 4, two, 20.0, 1.0)
    ok &= check("  bamboo (second failure is a restart)", r["useful"] / 20, (12 + 5) / 20)
    # varuna: restart runs again from 13.0 to 15.0; iteration 15-17, checkpoint 17-18,
    # iteration 18-20.
    r = simulate(varuna, 4, two, 20.0, 1.0)
    ok &= check("  varuna", r["useful"] / 20, 12 / 20)
    ok &= check("  varuna pauses", r["paused"], 2.5)
    # Every trace: the states add up to the wall time (asserted inside simulate).
    for spec in DEFAULT_TRACES:
        name, n0, failures, _ = load_trace(spec)
        for p in (tandem, oobleck, varuna, bamboo):
            simulate(p, n0, failures, horizon_of(failures, n0), 1.0)
    print("self-check " + ("passed" if ok else "FAILED"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="BERT-large",
                    help="which model's costs to take from Oobleck's simulator")
    ap.add_argument("--traces", default=",".join(DEFAULT_TRACES),
                    help="names in tests/data/oobleck_traces or paths to .csv files")
    ap.add_argument("--tandem-recovery-s", type=float, default=1.3,
                    help="tandem's pause per failure (measured: kill to the end of the first "
                         "step after, heartbeat timeout 1 s)")
    ap.add_argument("--iteration-s", type=float, default=1.0,
                    help="iteration time on all the trace's nodes, every system")
    ap.add_argument("--scales", default="0.25,0.5,1,2,4",
                    help="factors on the inter-failure times for the sweep")
    ap.add_argument("--bamboo-redundancy", type=float, default=0.0,
                    help="share of Bamboo's iteration spent on redundant computation")
    ap.add_argument("--phase-samples", type=int, default=16,
                    help="average over this many copies of each trace with every failure at a "
                         "random point of its iteration; 0: the exact trace times")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--self-check", action="store_true",
                    help="check the simulation on hand-computed cases and exit")
    args = ap.parse_args()
    if args.self_check:
        sys.exit(0 if self_check() else 1)
    if args.iteration_s <= 0 or args.tandem_recovery_s < 0 or not 0 <= args.bamboo_redundancy < 1:
        ap.error("--iteration-s > 0, --tandem-recovery-s >= 0, 0 <= --bamboo-redundancy < 1")
    args.traces = [t for t in args.traces.split(",") if t]
    args.scales = [float(s) for s in args.scales.split(",") if s]
    res = run_all(args)
    if args.format == "json":
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print_table(res)


if __name__ == "__main__":
    main()
