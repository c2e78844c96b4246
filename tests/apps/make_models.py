#!/usr/bin/env python3
"""Python side of pipetrain's interoperability tests (run with the project's Python, the venv of
scripts/bootstrap --print-python).

Subcommands:
  mlp OUTDIR [--seed S] [--rows R]
      Writes OUTDIR/mlp.pt (a scripted nn.Sequential MLP, 5 layers, 8 -> 4), OUTDIR/x.pt (R x 8
      float32 inputs), OUTDIR/y_mse.pt (R x 4 float32 targets) and OUTDIR/y_ce.pt (R int64 class
      indices in [0, 4)), all from fixed seeds; and bad targets for exit-code tests:
      OUTDIR/y_short.pt (R-1 rows) and OUTDIR/y_ce_big.pt (a class index 7).
  fixtures OUTDIR
      Writes TorchScript models for tests/stage/torchscript_test.cpp: OUTDIR/nested.pt (children
      with nested submodules, MultiheadAttention, BatchNorm1d, Dropout), OUTDIR/nested_input.pt
      and OUTDIR/nested_eval_output.pt (Python's eval-mode output for that input).
  reference --model M --inputs X --targets Y --loss mse|cross-entropy --lr LR [--momentum MU]
            --batch-size N --steps S --out OUT
      Trains the TorchScript model sequentially in Python with the batching of `pipetrain train`
      (rows (s*N + 0..N-1) mod R at step s, no shuffle) and torch.optim.SGD, and saves
      {name: parameter} with torch.save. Prints one "step s loss L" line per step.
  batch FILE
      Runs each non-empty line of FILE as a command line of this script, in one process (saves
      starting Python and importing torch once per command). Stops at the first failure.
  compare GOT EXPECTED [--rtol T]
      Loads two {name: tensor} files with torch.load and checks that they hold the same names and
      that, per tensor, max|got - expected| <= T * max|expected| (default T = 1e-5). Prints the
      worst relative error; exits 1 on a mismatch.
"""
import argparse
import os
import sys

import torch
from torch import nn


def make_mlp():
    return nn.Sequential(
        nn.Linear(8, 16),
        nn.Tanh(),
        nn.Linear(16, 16),
        nn.ReLU(),
        nn.Linear(16, 4),
    )


def cmd_mlp(args):
    os.makedirs(args.outdir, exist_ok=True)
    torch.manual_seed(args.seed)
    model = torch.jit.script(make_mlp())
    torch.jit.save(model, os.path.join(args.outdir, "mlp.pt"))
    generator = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.rows, 8, generator=generator)
    y_mse = torch.randn(args.rows, 4, generator=generator)
    y_ce = torch.randint(0, 4, (args.rows,), generator=generator)
    torch.save(x, os.path.join(args.outdir, "x.pt"))
    torch.save(y_mse, os.path.join(args.outdir, "y_mse.pt"))
    torch.save(y_ce, os.path.join(args.outdir, "y_ce.pt"))
    # Bad inputs for the exit-code tests: one row short, and a label the model cannot output.
    torch.save(y_mse[1:].clone(), os.path.join(args.outdir, "y_short.pt"))
    y_ce_big = y_ce.clone()
    y_ce_big[3] = 7
    torch.save(y_ce_big, os.path.join(args.outdir, "y_ce_big.pt"))


class Block(nn.Module):
    """A child with nested submodules, so parameter names have two dots."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        seq = x.view(x.size(0), 2, 4).repeat(1, 1, 2)  # (N, 2, 8)
        attended, _ = self.attn(seq, seq, seq, need_weights=False)
        return self.norm(attended.mean(dim=1) + x)


def cmd_fixtures(args):
    os.makedirs(args.outdir, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 8),
        nn.ReLU(),
        Block(),
        nn.BatchNorm1d(8),
        nn.Dropout(0.5),
        nn.Linear(8, 3),
    )
    # Non-trivial running statistics, so eval mode differs from train mode.
    with torch.no_grad():
        model[3].running_mean.uniform_(-0.5, 0.5)
        model[3].running_var.uniform_(0.5, 2.0)
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, os.path.join(args.outdir, "nested.pt"))
    x = torch.randn(5, 6)
    scripted.eval()
    with torch.no_grad():
        y = scripted(x)
    torch.save(x, os.path.join(args.outdir, "nested_input.pt"))
    torch.save(y, os.path.join(args.outdir, "nested_eval_output.pt"))


def cmd_reference(args):
    model = torch.jit.load(args.model)
    model.train()
    x = torch.load(args.inputs)
    y = torch.load(args.targets)
    rows = x.size(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for step in range(args.steps):
        index = (step * args.batch_size + torch.arange(args.batch_size)) % rows
        output = model(x[index])
        if args.loss == "mse":
            loss = nn.functional.mse_loss(output, y[index])
        else:
            loss = nn.functional.cross_entropy(output, y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save(params, args.out)


def cmd_compare(args):
    got = torch.load(args.got)
    expected = torch.load(args.expected)
    if not isinstance(got, dict):
        print(f"{args.got}: expected a dict, got {type(got).__name__}")
        return 1
    if list(got.keys()) != list(expected.keys()):
        print(f"names differ:\n  got      {list(got.keys())}\n  expected {list(expected.keys())}")
        return 1
    worst = 0.0
    failed = False
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape or have.dtype != want.dtype:
            print(f"{name}: got {tuple(have.shape)} {have.dtype}, "
                  f"expected {tuple(want.shape)} {want.dtype}")
            failed = True
            continue
        scale = max(want.abs().max().item(), 1e-12)
        error = (have - want).abs().max().item() / scale
        worst = max(worst, error)
        if error > args.rtol:
            print(f"{name}: relative error {error:.3e} > {args.rtol:.1e}")
            failed = True
    print(f"compared {len(expected)} tensors; worst relative error {worst:.3e}")
    return 1 if failed else 0


def cmd_batch(args):
    import shlex
    with open(args.file) as lines:
        for line in lines:
            if line.strip():
                code = run(shlex.split(line))
                if code:
                    return code
    return 0


def run(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("mlp")
    p.add_argument("outdir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=20)
    p.set_defaults(run=cmd_mlp)

    p = sub.add_parser("fixtures")
    p.add_argument("outdir")
    p.set_defaults(run=cmd_fixtures)

    p = sub.add_parser("reference")
    p.add_argument("--model", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--targets", required=True)
    p.add_argument("--loss", choices=["mse", "cross-entropy"], required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_reference)

    p = sub.add_parser("batch")
    p.add_argument("file")
    p.set_defaults(run=cmd_batch)

    p = sub.add_parser("compare")
    p.add_argument("got")
    p.add_argument("expected")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.set_defaults(run=cmd_compare)

    args = parser.parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
