"""bench/gpu/trace_summary.py on made-up traces whose answers are known: the GPU's busy time is
the union of overlapping kernels, idle the rest of the span, kernels grouped by shortened name
and compared side by side; a trace without GPU activity is an error that names it.

  python3 tests/bench/trace_summary_test.py bench/gpu/trace_summary.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def cpu(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def write(directory, name, events):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)
    return path


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class TraceSummaryTest(unittest.TestCase):
    def test_busy_is_the_union_and_kernels_line_up(self):
        with tempfile.TemporaryDirectory() as d:
            # 0-10 and 5-15 overlap (15 us busy), then 30-40: span 40, busy 25, idle 15.
            a = write(d, "a.json", [cpu("aten::mm", 0, 50), kernel("gemm<float>(int)", 0, 10),
                                    kernel("add", 5, 10), kernel("add", 30, 10)])
            b = write(d, "b.json", [kernel("gemm<half>(int)", 100, 4000)])
            r = run(a, b)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertIn("GPU span 0.04 ms, busy 0.03 ms, idle 0.01 ms; 3 GPU activities; "
                          "1 CPU operators over 0.05 ms", lines[0])
            self.assertIn("GPU span 4.00 ms, busy 4.00 ms, idle 0.00 ms", lines[1])
            rows = {line.split()[0]: line.split()[1:] for line in lines[4:]}
            # Template arguments and parameters shortened: both GEMMs are one row.
            self.assertEqual(rows["gemm<>()"], ["0.01", "1", "4.00", "1"])
            self.assertEqual(rows["add"], ["0.02", "2", "0.00", "0"])
            self.assertEqual(list(rows)[0], "gemm<>()")  # the longest first

    def test_a_trace_without_gpu_activity_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            path = write(d, "cpu.json", [cpu("aten::mm", 0, 5)])
            r = run(path)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no GPU activity", r.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
