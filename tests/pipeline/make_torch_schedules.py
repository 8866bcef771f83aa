"""Writes the CSV schedules of tests/data/torch_schedules/ with torch.distributed.pipelining.

Each schedule is built for every pipeline rank from stand-in stages (no process group, no
model: a schedule's order depends only on the stage indices, the ranks and the micro-batches)
and dumped with the schedule's own _dump_csv, in both of its forms: compute only
("<name>.csv", the input of _load_csv(format="compute_only")) and lowered with the
communication actions ("<name>_comms.csv", format="compute_comms").

    python tests/pipeline/make_torch_schedules.py OUT_DIR

Needs torch (2.x, CPU is enough); tandem's build and CI do not run this script.
"""

import os
import sys

import torch
from torch.distributed.pipelining import schedules


class StandInStage:
    """What a schedule's constructor reads of a stage."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = {}
        self.submod = torch.nn.Identity()


# (file name, schedule class, pipeline ranks, micro-batches, stages per rank, "loop" or "v")
CASES = [
    ("interleaved1f1b_p4_m8", schedules.ScheduleInterleaved1F1B, 4, 8, 2, "loop"),
    ("interleaved1f1b_p2_m6", schedules.ScheduleInterleaved1F1B, 2, 6, 2, "loop"),
    ("loopedbfs_p2_m4", schedules.ScheduleLoopedBFS, 2, 4, 2, "loop"),
    ("interleavedzb_p4_m8", schedules.ScheduleInterleavedZeroBubble, 4, 8, 2, "loop"),
    ("zbv_p4_m8", schedules.ScheduleZBVZeroBubble, 4, 8, 2, "v"),
    ("zbv_p2_m4", schedules.ScheduleZBVZeroBubble, 2, 4, 2, "v"),
    ("dualpipev_p4_m8", getattr(schedules, "ScheduleDualPipeV", None), 4, 8, 2, "v"),
]


def stage_indices(rank, ranks, per_rank, style):
    if style == "loop":
        return [rank + k * ranks for k in range(per_rank)]
    # V: down the ranks, then back up.
    return [rank, 2 * ranks - 1 - rank]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, cls, ranks, microbatches, per_rank, style in CASES:
        if cls is None:
            print(f"skipped {name}: this torch has no such schedule")
            continue
        num_stages = ranks * per_rank
        # The schedule object of rank 0 holds every rank's order.
        stages = [
            StandInStage(s, num_stages, ranks, 0)
            for s in stage_indices(0, ranks, per_rank, style)
        ]
        schedule = cls(stages, microbatches)
        schedule._dump_csv(os.path.join(out_dir, name + ".csv"), format="compute_only")
        schedule._dump_csv(os.path.join(out_dir, name + "_comms.csv"), format="compute_comms")
        print(f"wrote {name} (torch {torch.__version__})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/torch_schedules")
