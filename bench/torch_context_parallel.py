#!/usr/bin/env python3
"""torch's own context parallelism, the peer of `pipetrain bench --suite long`.

transformers' LlamaForCausalLM of the long suite's config (bench_options.cpp's llama_bench_config
with 2 layers and positions up to --seq-len) trained on one row of --seq-len random ids, split
over every process by torch.distributed.tensor.experimental.context_parallel (ring attention, its
load-balanced causal sharding) on a 1-D "cp" DeviceMesh over Gloo on the CPU. Launch with
torchrun, one process per cp rank, on loopback only:

  GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 -- \
      bench/torch_context_parallel.py --seq-len 4096 --width 256 --layers 2

One step: zero_grad, forward of the sharded row inside context_parallel, the mean cross-entropy,
backward, the gradients summed over the ranks (all_reduce), SGD at lr 0.01.

Rank 0 prints one line to stdout: PIPETRAIN_BENCH_RESULT {"step_seconds": s} (the median over the
timed steps of the slowest rank's time), or, where torch's context parallelism does not run on
this machine (its sharding of the CPU attention kernel), PIPETRAIN_BENCH_UNSUPPORTED {"reason":
...} naming torch's error. Everything else goes to stderr.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from transformers import LlamaConfig, LlamaForCausalLM

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    config = LlamaConfig(
        vocab_size=4096, hidden_size=a.width, intermediate_size=(a.width * 8 // 3 + 15) // 16 * 16,
        num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=4,
        head_dim=a.width // 8, max_position_embeddings=a.seq_len, rms_norm_eps=1e-5,
        tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 4096, (1, a.seq_len + 1))
    times = []
    try:
        for step in range(a.warmup + a.steps):
            x = ids[:, :-1].clone()
            y = ids[:, 1:].clone()
            positions = torch.arange(a.seq_len).unsqueeze(0)
            dist.barrier()
            begin = time.perf_counter()
            optimizer.zero_grad()
            with context_parallel(mesh, buffers=[x, y, positions], buffer_seq_dims=[1, 1, 1]):
                logits = model(input_ids=x, position_ids=positions).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                         y.reshape(-1))
                loss.backward()
            for parameter in model.parameters():
                if parameter.grad is not None:
                    dist.all_reduce(parameter.grad)
            optimizer.step()
            elapsed = torch.tensor(time.perf_counter() - begin)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step >= a.warmup:
                times.append(elapsed.item())
    except (NotImplementedError, RuntimeError) as error:
        if rank == 0:
            reason = f"torch {torch.__version__}: {type(error).__name__}: {str(error).splitlines()[0]}"
            print("PIPETRAIN_BENCH_UNSUPPORTED " + json.dumps({"reason": reason}), flush=True)
        dist.destroy_process_group()
        return 0
    if rank == 0:
        print("PIPETRAIN_BENCH_RESULT " + json.dumps({"step_seconds": statistics.median(times)}),
              flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
