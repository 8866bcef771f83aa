#!/usr/bin/env python3
"""tandem's PipeDream planner against PipeDream's own optimizer (msr-fiddle/pipedream,
optimizer/optimizer_graph_hierarchical.py) on the profiles PipeDream publishes.

PipeDream is not part of tandem: clone it yourself (tested at 7db6a1c) and pass the checkout.
Its optimizer is copied into a temporary folder and run under Python 3 with two small changes
made there (graphviz becomes optional, numpy's debug prints go); it is otherwise unchanged.
One run at the largest machine count gives the figure for every smaller count: without the
memory constraint PipeDream's table for m machines does not depend on the total.

  bench/planner/pipedream_compare.py --pipedream /tmp/pipedream [--tandem build/bin/tandem]
      [--models vgg16 resnet50] [--machines 2 4 8 16 32 64] [--modes straight replicated]

For each profile, machine count and mode it prints PipeDream's "time per stage in pipeline",
tandem's (`tandem plan --algorithm pipedream --bandwidth 1e9`, over PipeDream's antichain
states) and their relative difference; exit 1 if any differs by more than --tolerance.
Inception and NASNet have too many antichain states for either optimizer (PipeDream's README
says to compress their branches first); they are skipped unless named with --models.
"""

import argparse
import contextlib
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIPPED = ("inception_v3", "nasnetalarge", "nasnetamobile")


def load_optimizer(checkout, workdir):
    """PipeDream's optimizer module, copied into workdir with the Python 3 changes."""
    shutil.copytree(os.path.join(checkout, "graph"), os.path.join(workdir, "graph"))
    for name in ("optimizer_graph_hierarchical.py", "utils.py"):
        shutil.copy(os.path.join(checkout, "optimizer", name), workdir)
    graph_py = os.path.join(workdir, "graph", "graph.py")
    with open(graph_py) as f:
        text = f.read()
    text = text.replace("import graphviz\n",
                        "try:\n    import graphviz\nexcept ImportError:\n    graphviz = None\n", 1)
    with open(graph_py, "w") as f:
        f.write(text)
    optimizer_py = os.path.join(workdir, "optimizer_graph_hierarchical.py")
    with open(optimizer_py) as f:
        text = f.read()
    text = re.sub(r"^(\s*)import numpy as np$", r"\1pass", text, flags=re.M)
    text = re.sub(r"^(\s*)print\(np\.array\(compute_times\)\)$", r"\1pass", text, flags=re.M)
    with open(optimizer_py, "w") as f:
        f.write(text)
    sys.path.insert(0, workdir)
    sys.setrecursionlimit(100000)
    import optimizer_graph_hierarchical as optimizer
    return optimizer


def pipedream_figures(optimizer, profile, top, straight, bandwidth):
    """PipeDream's time per stage for 1..top machines (None where it finds no partition)."""
    tables = []
    original = optimizer.compute_partitioning

    def capture(*args, **kwargs):
        table = original(*args, **kwargs)
        tables.append(table)
        return table

    optimizer.compute_partitioning = capture
    for name, value in (("straight_pipeline", straight), ("use_memory_constraint", False),
                        ("use_fewer_machines", False), ("activation_compression_ratio", None),
                        ("memory_size", 16e9)):
        setattr(optimizer, name, value)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimizer.main([top], profile, [bandwidth], 16e9, straight, False, False, None, None,
                           print_configuration=False, verbose=False)
    except Exception:  # its report fails when no partition exists; the table is complete
        pass
    finally:
        optimizer.compute_partitioning = original
    table = tables[0]
    last = len(table[0]) - 1
    return {m: table[0][last][m - 1][0] for m in range(1, top + 1)}


def tandem_figure(tandem, profile, machines, straight, bandwidth):
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.json")
        argv = [tandem, "plan", "--profile", profile, "--profile-format", "pipedream",
                "--algorithm", "pipedream", "--devices", str(machines), "--bandwidth",
                repr(bandwidth), "-o", plan] + (["--straight"] if straight else [])
        run = subprocess.run(argv, capture_output=True, text=True)
        if run.returncode != 0:
            return None
        # The plan itself is PipeDream's optimum over its antichain states (its layer_order
        # keeps each stage contiguous); a note says when another search ran instead.
        if "not PipeDream's optimum" in run.stdout:
            return None
        with open(plan) as f:
            return json.load(f)["bottleneck_seconds"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipedream", required=True, help="a checkout of msr-fiddle/pipedream")
    parser.add_argument("--tandem", default=os.path.join(REPO, "build", "bin", "tandem"))
    parser.add_argument("--models", nargs="*", help="profile folder names (default: all)")
    parser.add_argument("--machines", type=int, nargs="*", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--modes", nargs="*", default=["straight", "replicated"])
    parser.add_argument("--bandwidth", type=float, default=1e9)
    parser.add_argument("--tolerance", type=float, default=1e-9)
    args = parser.parse_args()
    profiles = sorted(glob.glob(os.path.join(args.pipedream, "profiler", "*", "profiles", "*",
                                             "graph.txt")))
    if not profiles:
        parser.error(f"{args.pipedream}: no profiler/*/profiles/*/graph.txt")
    tandem = os.path.abspath(args.tandem)
    workdir = tempfile.mkdtemp()
    try:
        optimizer = load_optimizer(os.path.abspath(args.pipedream), workdir)
        print(f"{'model':<14} {'mode':<10} {'machines':>8} {'PipeDream s':>22} "
              f"{'tandem s':>22} {'rel. diff':>9}")
        differences = 0
        for profile in profiles:
            model = os.path.basename(os.path.dirname(profile))
            if args.models and model not in args.models:
                continue
            if not args.models and model in SKIPPED:
                print(f"{model:<14} skipped (too many antichain states)")
                continue
            for mode in args.modes:
                start = time.time()
                figures = pipedream_figures(optimizer, profile, max(args.machines),
                                            mode == "straight", args.bandwidth)
                seconds = time.time() - start
                for machines in args.machines:
                    reference = figures[machines]
                    ours = tandem_figure(tandem, profile, machines, mode == "straight",
                                         args.bandwidth)
                    if reference is None or ours is None:
                        same = reference is None and ours is None
                        diff = "" if same else "MISMATCH"
                    else:
                        relative = abs(ours - reference) / reference
                        same = relative <= args.tolerance
                        diff = f"{relative:.1e}" + ("" if same else " MISMATCH")
                    differences += 0 if same else 1
                    print(f"{model:<14} {mode:<10} {machines:>8} {reference!r:>22} "
                          f"{ours!r:>22} {diff:>9}", flush=True)
                print(f"# {model} {mode}: PipeDream took {seconds:.1f} s", flush=True)
        print(f"{differences} differences")
        return 1 if differences else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
