"""The history reference: one run's metrics as TensorBoard event files, written and read back
with TensorBoard's own code (no TensorFlow, no torch imported).

write DIR RANKS STEPS: one event file per rank (DIR/rank-NN, as each rank of a PyTorch job
  logs its own), written by tensorboard.summary.writer.event_file_writer.EventFileWriter with
  classic simple_value scalar summaries (what torch.utils.tensorboard.SummaryWriter.add_scalar
  writes); points in the order a run produces them: step by step, rank by rank, 4 metrics.
load DIR: EventAccumulator (what TensorBoard's Python loader and most scripts use) over every
  rank directory with no down-sampling, then one metric's full series for every rank.
Each mode prints one JSON line; the driver measures wall time and peak RSS around it too.
"""

import json
import math
import os
import sys
import time

METRICS = ["loss", "lr", "grad_norm", "step_time_ms"]


def value(metric, rank, step):
    """benches/fdbench/history.rs's `value`: the same numbers on both sides."""
    noise = ((rank * 7919 + step * 104729 + metric * 31) % 1000) / 1000.0
    if metric == 0:
        return 0.5 + 2.5 * math.exp(-step / 2000.0) + 0.05 * noise
    if metric == 1:
        return 3e-3 * (1.0 - step / 20000.0)
    if metric == 2:
        return 0.3 + noise
    return 90.0 + 20.0 * noise


def write(root, ranks, steps):
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    t0 = time.perf_counter()
    writers = [EventFileWriter(os.path.join(root, f"rank-{r:02d}")) for r in range(ranks)]
    points = 0
    for step in range(1, steps + 1):
        wall = time.time()
        for r, w in enumerate(writers):
            for m, tag in enumerate(METRICS):
                summary = Summary(value=[Summary.Value(tag=tag, simple_value=value(m, r, step))])
                w.add_event(Event(wall_time=wall, step=step, summary=summary))
                points += 1
    for w in writers:
        w.close()  # flushes the queue and the file
    print(json.dumps({"points": points, "seconds": time.perf_counter() - t0}), flush=True)


def load(root):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t0 = time.perf_counter()
    total, acc_sum = 0, 0.0
    for d in sorted(os.listdir(root)):
        ea = EventAccumulator(os.path.join(root, d), size_guidance={"scalars": 0})
        ea.Reload()
        series = ea.Scalars("loss")
        total += len(series)
        acc_sum += sum(e.value for e in series)
    print(json.dumps({"points": total, "sum": acc_sum, "series_s": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "write" and len(sys.argv) == 5:
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "load" and len(sys.argv) == 3:
        load(sys.argv[2])
    else:
        sys.exit("usage: history_tb.py write DIR RANKS STEPS | load DIR")
