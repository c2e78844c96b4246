"""Writes the compute-only action lists of torch.distributed.pipelining schedules as the CSV its
_PipelineScheduleRuntime dumps (one row per rank), without a process group: the schedule classes
only read the stages' shape (index, count, rank, group size) to build their lists.

    python torch_schedule_csv.py OUT_DIR NAME:RANKS:MICROBATCHES ...

writes OUT_DIR/NAME-RANKS-MICROBATCHES.csv, or OUT_DIR/NAME-RANKS-MICROBATCHES.refused with
torch's message when torch refuses the shape. NAME: looped-bfs, interleaved-1f1b,
interleaved-zb, zb-v, dualpipev; each with two stages per rank.
"""
import os
import csv
import sys

import torch.distributed.pipelining.schedules as schedules

CLASSES = {
    "looped-bfs": schedules.ScheduleLoopedBFS,
    "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
    "interleaved-zb": schedules.ScheduleInterleavedZeroBubble,
    "zb-v": schedules.ScheduleZBVZeroBubble,
    "dualpipev": schedules.ScheduleDualPipeV,
}


class ShapeOnlyStage:
    """What the schedule constructors read of a PipelineStage."""

    def __init__(self, index, num_stages, rank, ranks):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.stage_index_to_group_rank = {}
        self.submod = None  # not a module: the torch.compile check skips it


def dump(name, ranks, microbatches, path):
    num_stages = 2 * ranks
    v_shape = name in ("zb-v", "dualpipev")
    stages = []
    for index in range(num_stages):
        rank = (index if index < ranks else num_stages - 1 - index) if v_shape else index % ranks
        if rank == 0:
            stages.append(ShapeOnlyStage(index, num_stages, 0, ranks))
    try:
        schedule = CLASSES[name](stages, microbatches, loss_fn=lambda out, target: out.sum())
    except Exception as error:  # torch's own checks (e.g. M too small for the shape)
        with open(path + ".refused", "w") as f:
            f.write(str(error) + "\n")
        return
    with open(path + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        for rank in range(ranks):
            writer.writerow(["" if a is None else str(a) for a in schedule.pipeline_order[rank]])


def main():
    out_dir = sys.argv[1]
    for shape in sys.argv[2:]:
        name, ranks, microbatches = shape.split(":")
        dump(name, int(ranks), int(microbatches),
             os.path.join(out_dir, f"{name}-{ranks}-{microbatches}"))


if __name__ == "__main__":
    main()
