#!/usr/bin/env python3
"""The in-process Python peer for `pipetrain bench`: torchgpipe 0.0.7's GPipe (the implementation
torch.distributed.pipeline.sync.Pipe was taken from, which PyTorch 2.x no longer ships), on the
same model, batch and thread settings, with every partition on the CPU.

Prints one JSON object: {"runtime": "torchgpipe", "suite", "stages", "chunks", "checkpoint",
"step_seconds" (median), "steps", "peak_rss_bytes"}. Timing covers one full training step: forward
through GPipe, mean loss, backward, SGD step -- the same work pipetrain's rows time.

Usage: torchgpipe_peer.py --suite mlp --stages 2 --chunks 8 --batch 256 --threads 2 --steps 5 --warmup 2
Run it with the project's Python (scripts/bootstrap --print-python), which has torchgpipe.
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn


def mlp(width=1024, layers=8):
    """`--suite mlp` (8 x Linear(1024) + ReLU) and, with width 256 and 16 layers, `--suite small`."""
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*modules), (width,), width


def cnn(width=32, blocks=1, classes=10):
    """examples/cnn.cpp's layer list, entry for entry, so a partition of K stages cuts the same
    layers as pipetrain's Pipe (the first L % K stages get one layer more, both sides). The
    residual blocks use torchgpipe-style skip connections (@skippable stash/pop), which Pipe
    carries across partitions the way pipetrain's SkipStash/SkipPopAdd are carried."""
    from torchgpipe.skip import pop, skippable, stash

    def conv3x3(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)

    def stash_skip(name):
        @skippable(stash=[name])
        class SkipStash(nn.Module):
            def forward(self, x):
                yield stash(name, x)
                return x
        return SkipStash()

    def add_skip(name):
        @skippable(pop=[name])
        class SkipPopAdd(nn.Module):
            def forward(self, x):
                skip = yield pop(name)
                return x + skip
        return SkipPopAdd()

    def block(name, c):
        return [stash_skip(name), conv3x3(c, c), nn.BatchNorm2d(c), nn.ReLU(),
                conv3x3(c, c), nn.BatchNorm2d(c), add_skip(name), nn.ReLU()]

    w = width
    layers = [conv3x3(1, w), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
    for k in range(blocks):
        layers += block("res0.%d" % k, w)
    layers += [conv3x3(w, 2 * w, stride=2), nn.BatchNorm2d(2 * w), nn.ReLU()]
    for k in range(blocks):
        layers += block("res1.%d" % k, 2 * w)
    layers += [nn.Flatten(), nn.Linear(2 * w * 7 * 7, classes)]
    return nn.Sequential(*layers), (1, 28, 28), classes


def balance(model, stages):
    """pipetrain's default balance: the first L % K stages get one layer more."""
    base, extra = divmod(len(list(model.children())), stages)
    return [base + (1 if j < extra else 0) for j in range(stages)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="mlp", choices=["mlp", "small", "cnn"])
    parser.add_argument("--width", type=int, default=0,
                        help="mlp features / cnn channels (0: mlp 1024, small 256, cnn 32)")
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

    from torchgpipe import GPipe
    torch.manual_seed(0)
    if args.suite in ("mlp", "small"):
        if args.suite == "mlp":
            model, in_shape, out_width = mlp(args.width or 1024)
        else:
            model, in_shape, out_width = mlp(args.width or 256, layers=16)
        y = torch.randn(args.batch, out_width)
        loss_fn = nn.functional.mse_loss
    else:
        model, in_shape, classes = cnn(args.width or 32)
        y = torch.randint(0, classes, (args.batch,))
        loss_fn = nn.functional.cross_entropy
    pipe = GPipe(model, balance=balance(model, args.stages), devices=["cpu"] * args.stages,
                 chunks=args.chunks, checkpoint=args.checkpoint,
                 deferred_batch_norm=args.suite == "cnn")
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.01)
    x = torch.randn(args.batch, *in_shape)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(pipe(x), y)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    print(json.dumps({
        "runtime": "torchgpipe", "suite": args.suite, "schedule": "gpipe",
        "stages": args.stages, "chunks": args.chunks, "checkpoint": args.checkpoint,
        "step_seconds": statistics.median(times), "step_seconds_all": times, "steps": len(times),
        "threads": torch.get_num_threads(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    sys.exit(main())
