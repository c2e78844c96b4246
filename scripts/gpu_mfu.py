"""Tokens/s and MFU of a Llama-3.2-1B-shaped model: pipetrain against transformers' own loop.

`make gpu-check` runs it on the GPU (scripts/gpu-mfu): a model of Llama-3.2-1B's shape with random
weights (pipetrain's `--init random`; nothing is downloaded), bf16 autocast over float32 weights,
AdamW, sequences of 2048 random token ids, a few steps of

  pipetrain  one stage (sequential training: the whole batch at once)
  pipetrain  two stages sharing the device (1F1B, 4 micro-batches)
  transformers  LlamaForCausalLM with the same config, batch, precision and optimizer, the
                plain PyTorch loop (forward with labels, backward, step)

each timed over all its steps, with the FLOPs per token pipetrain counts from the config (6N plus
attention, models::LlamaConfig::training_flops_per_token) over the device's peak (the table in
train/device_peak.h, or --peak-tflops) for all three. Prints a table and writes it as JSON.
`--tiny` runs a small shape on the CPU: what tests/apps/gpu_mfu_test.cpp runs, so that the script
keeps working where no GPU is.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

# Llama-3.2-1B's config.json, as published (the shape; the weights are random).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}

TINY = dict(LLAMA_32_1B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
            bos_token_id=1, eos_token_id=2)


def run_pipetrain(binary, flags, summary_path):
    command = [binary, "train"] + flags + ["--summary-json", summary_path]
    print("gpu-mfu: " + " ".join(command), flush=True)
    started = time.time()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout)
        raise SystemExit(f"gpu-mfu: pipetrain exited {done.returncode}")
    with open(summary_path) as f:
        summary = json.load(f)
    summary["wall_seconds"] = time.time() - started
    return summary


def run_transformers(config, ids, batch, seq_len, steps, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(device)  # float32 weights
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    windows = torch.from_numpy(ids[: steps * batch * seq_len].astype(np.int64)).view(
        steps, batch, seq_len)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.time()
    first = last = None
    for step in range(steps):
        x = windows[step].to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # a host sync each step, as pipetrain's loss
        first = value if first is None else first
        last = value
    seconds = time.time() - started
    tokens = steps * batch * seq_len
    return {"seconds": seconds, "tokens": tokens, "tokens_per_second": tokens / seconds,
            "first_loss": first, "last_loss": last}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipetrain", required=True, help="the pipetrain binary")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--tiny", action="store_true", help="a small shape (checks on the CPU)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=0, help="0: pipetrain's table")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()

    config = TINY if args.tiny else LLAMA_32_1B
    with tempfile.TemporaryDirectory(prefix="pipetrain_gpu_mfu_") as work:
        os.makedirs(os.path.join(work, "model"))
        with open(os.path.join(work, "model", "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        rng = np.random.default_rng(0)
        count = (args.steps + 1) * args.batch_size * args.seq_len + 1
        ids = rng.integers(0, config["vocab_size"], size=count, dtype=np.uint32)
        token_file = os.path.join(work, "tokens.bin")
        ids.tofile(token_file)

        common = ["--model", os.path.join(work, "model"), "--init", "random", "--data", "tokens",
                  "--token-file", token_file, "--token-bytes", "4", "--seq-len",
                  str(args.seq_len), "--batch-size", str(args.batch_size), "--steps",
                  str(args.steps), "--optimizer", "adamw", "--lr", "1e-4", "--precision", "bf16"]
        if args.peak_tflops > 0:
            common += ["--peak-tflops", str(args.peak_tflops)]
        runs = {
            "pipetrain, one stage": common + ["--device", args.device, "--chunks", "1"],
            "pipetrain, two stages on one device": common + [
                "--stages", "2", "--chunks", "4", "--schedule", "1f1b", "--devices",
                f"{args.device},{args.device}"],
        }
        results = {}
        for name, flags in runs.items():
            results[name] = run_pipetrain(args.pipetrain, flags,
                                          os.path.join(work, f"summary{len(results)}.json"))
        reference = results["pipetrain, one stage"]
        if not (reference.get("mfu", 0) > 0 and reference.get("peak_flops", 0) > 0):
            raise SystemExit("gpu-mfu: pipetrain reported no MFU: " + json.dumps(reference))
        flops_per_token = reference["mfu"] * reference["peak_flops"] / reference[
            "tokens_per_second"]
        try:
            import transformers  # noqa: F401
        except ImportError as error:
            hf = None
            print(f"gpu-mfu: transformers' loop skipped: {error} (scripts/bootstrap installs it)")
        else:
            hf = run_transformers(config, ids, args.batch_size, args.seq_len, args.steps,
                                  args.device)
            hf["mfu"] = hf["tokens_per_second"] * flops_per_token / reference["peak_flops"]
            results["transformers' own loop"] = hf

    print(f"\ngpu-mfu: Llama-3.2-1B shape{' (tiny)' if args.tiny else ''}, batch "
          f"{args.batch_size} x {args.seq_len} tokens, {args.steps} steps, bf16, AdamW, on "
          f"{args.device}; {flops_per_token / 1e9:.3f} GFLOP a token; peak "
          f"{reference['peak_flops'] / 1e12:.1f} TFLOP/s ({reference.get('peak_source', '')})")
    print(f"{'run':<36} {'tokens/s':>12} {'MFU':>8} {'loss':>18}")
    for name, r in results.items():
        print(f"{name:<36} {r['tokens_per_second']:>12.0f} {100 * r['mfu']:>7.1f}% "
              f"{r['first_loss']:>8.3f} -> {r['last_loss']:<8.3f}")
    best = max(r["mfu"] for name, r in results.items() if name.startswith("pipetrain"))
    print(f"goal: 45% MFU for pipetrain; its best here {100 * best:.1f}% "
          f"({'met' if best >= 0.45 else 'not met'}), transformers' loop "
          + (f"{100 * hf['mfu']:.1f}%" if hf else "not run"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "tiny": args.tiny, "seq_len": args.seq_len,
                       "batch_size": args.batch_size, "steps": args.steps, "config": config,
                       "flops_per_token": flops_per_token, "runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
