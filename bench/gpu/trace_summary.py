"""Where a step's GPU time goes, from profiler traces (Chrome JSON from Kineto): tandem train
--torch-trace and bench/gpu/pytorch_gpt_bench.py --trace write them.

For each trace: the span from the first to the last GPU activity, the time the GPU was busy
(the union of kernels, copies and memsets), the idle rest, the CPU operators' own span, and
the kernels that took the most time in total (names shortened), side by side when given two.

  python3 bench/gpu/trace_summary.py TRACE.json [OTHER.json] [--top 25]
"""
import argparse
import collections
import json
import re
import sys

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def short(name):
    name = re.sub(r"<.*>", "<>", name)  # template arguments
    name = re.sub(r"\(.*\)", "()", name)
    return name[:70]


def summarize(path):
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    if not gpu:
        sys.exit(f"{path}: no GPU activity in the trace")
    intervals = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
    busy, end = 0.0, intervals[0][0]
    for start, stop in intervals:
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    span = intervals[-1][1] - intervals[0][0]
    by_kernel = collections.Counter()
    count = collections.Counter()
    for e in gpu:
        by_kernel[short(e["name"])] += float(e.get("dur", 0))
        count[short(e["name"])] += 1
    cpu_span = (max(float(e["ts"]) + float(e.get("dur", 0)) for e in cpu) -
                min(float(e["ts"]) for e in cpu)) if cpu else 0.0
    return {"path": path, "span_ms": span / 1e3, "busy_ms": busy / 1e3,
            "idle_ms": (span - busy) / 1e3, "kernels": len(gpu), "cpu_ops": len(cpu),
            "cpu_span_ms": cpu_span / 1e3, "by_kernel": by_kernel, "count": count}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    if len(args.traces) > 2:
        sys.exit("one or two traces")
    runs = [summarize(t) for t in args.traces]
    for r in runs:
        print(f"{r['path']}: GPU span {r['span_ms']:.2f} ms, busy {r['busy_ms']:.2f} ms, "
              f"idle {r['idle_ms']:.2f} ms; {r['kernels']} GPU activities; "
              f"{r['cpu_ops']} CPU operators over {r['cpu_span_ms']:.2f} ms")
    names = collections.Counter()
    for r in runs:
        for name, us in r["by_kernel"].items():
            names[name] = max(names[name], us)
    header = "".join(f"{'ms':>9} {'n':>5}" for _ in runs)
    print(f"\n{'kernel':<70} {header}")
    for name, _ in names.most_common(args.top):
        cells = "".join(f"{r['by_kernel'].get(name, 0) / 1e3:9.2f} {r['count'].get(name, 0):5d}"
                        for r in runs)
        print(f"{name:<70} {cells}")


if __name__ == "__main__":
    main()
