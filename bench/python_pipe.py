#!/usr/bin/python3
"""The Python peer for `pipetrain bench`: torch.distributed.pipeline.sync.Pipe (torchgpipe's GPipe,
shipped with Debian's python3-torch) on the same model, batch and thread settings.

Prints one JSON object: {"runtime": "python-pipe", "suite", "stages", "chunks", "checkpoint",
"step_seconds" (median), "steps", "peak_rss_bytes"}. Timing covers one full training step: forward
through the pipe, mean loss, backward, SGD step -- the same work pipetrain's rows time.

Usage: python_pipe.py --suite mlp --stages 2 --chunks 8 --batch 256 --threads 2 --steps 5 --warmup 2
"""
import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn


def mlp(width=1024, layers=8):
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*modules), (width,), width


def cnn():
    # Same shape as examples' cnn is not required for the ratio: the C++ side passes --suite cnn
    # only when it also runs this exact layer list (see bench/README in docs/BENCHMARKS.md).
    raise SystemExit("python_pipe.py: suite 'cnn' is not available for the Python peer")


def split(model, stages):
    layers = list(model.children())
    base, extra = divmod(len(layers), stages)
    parts, start = [], 0
    for j in range(stages):
        size = base + (1 if j < extra else 0)
        parts.append(nn.Sequential(*layers[start:start + size]))
        start += size
    return nn.Sequential(*parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="mlp", choices=["mlp"])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: leave)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--checkpoint", default="except_last",
                        choices=["always", "except_last", "never"])
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    # Pipe needs the RPC framework initialised, even in one process.
    import torch.distributed.rpc as rpc
    from torch.distributed.pipeline.sync import Pipe
    with tempfile.TemporaryDirectory() as tmp:
        rpc.init_rpc("worker", rank=0, world_size=1,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                         init_method="file://" + os.path.join(tmp, "rpc")))
        try:
            torch.manual_seed(0)
            model, in_shape, out_width = mlp()
            pipe = Pipe(split(model, args.stages), chunks=args.chunks, checkpoint=args.checkpoint)
            optimizer = torch.optim.SGD(pipe.parameters(), lr=0.01)
            x = torch.randn(args.batch, *in_shape)
            y = torch.randn(args.batch, out_width)
            times = []
            for step in range(args.warmup + args.steps):
                start = time.perf_counter()
                optimizer.zero_grad()
                out = pipe(x).local_value()
                loss = nn.functional.mse_loss(out, y)
                loss.backward()
                optimizer.step()
                elapsed = time.perf_counter() - start
                if step >= args.warmup:
                    times.append(elapsed)
        finally:
            rpc.shutdown()
    print(json.dumps({
        "runtime": "python-pipe", "suite": args.suite, "schedule": "gpipe",
        "stages": args.stages, "chunks": args.chunks, "checkpoint": args.checkpoint,
        "step_seconds": statistics.median(times), "steps": len(times),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    sys.exit(main())
