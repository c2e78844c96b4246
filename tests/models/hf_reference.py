#!/usr/bin/env python3
"""transformers' side of pipetrain's Llama tests: the reference every C++ result is compared with
(run with the project's Python, scripts/bootstrap --print-python).

Subcommands:
  make DIR --arch llama|qwen2|mistral [--seed S] [--layers L] [--vocab V] [--shard-bytes B]
           [--dtype float32|bfloat16] [--rope llama3|linear|default] [--legacy-rope]
      A small random model of that architecture (llama: grouped-query attention, untied head;
      qwen2: q/k/v biases, tied head; mistral: grouped-query, sliding window unset), saved with
      save_pretrained (safetensors; sharded when --shard-bytes is given). --legacy-rope rewrites
      config.json in the form published checkpoints have (rope_theta + rope_scaling).
  tokens FILE --count N --vocab V [--seed S] [--bytes 2|4]
      N random ids below V as a flat little-endian token file.
  logits DIR TOKENS OUT
      The logits of the model in DIR for the int64 ids in TOKENS (a safetensors file with
      "tokens" [B,T]), saved to OUT (safetensors, "logits").
  train DIR TOKENS OUT --seq-len T --batch-size N --steps K --lr LR [--betas B1,B2] [--eps E]
        [--weight-decay W]
      AdamW steps on the samples of token file TOKENS in order (sample s = ids s*T .. s*T+T,
      batch k = samples (b*N + n) mod S with b = k mod ceil(S/N), as pipetrain's TokenBatches),
      loss = mean cross-entropy of the logits, then
      save_pretrained(OUT). Prints "step k loss L".
  train-documents DIR PREFIX OUT --seq-len T --batch-size N --steps K --lr LR [--mask M]
        [--pack split|none] [--cross-document] [--betas B1,B2] [--eps E] [--weight-decay W]
      AdamW steps on the documents of the Megatron indexed dataset PREFIX (.idx/.bin read here
      with numpy), with the rules of pipetrain's --data indexed written out again: split rows
      are T + 1 ids of the documents laid end to end (row r at r*T); none rows are one document
      each (a document longer than T + 1 cut into pieces at p*T of T + 1 ids); batch k holds rows
      (b*N + n) mod R with b = k mod ceil(R/N). A target counts when it and its input lie in one
      document piece of the row and the mask M (an indexed dataset of the same shape) marks it 1.
      Each document piece of a row runs through the model as its own sequence (positions from 0)
      unless --cross-document, where each row runs whole; loss = the sum of cross-entropy over
      the batch's counted targets over their count. Then save_pretrained(OUT). Prints
      "step k loss L".
  eval DIR TOKENS --seq-len T
      The mean cross-entropy per target id over every sample of the token file, in order; prints
      "loss L perplexity P".
  generate DIR --prompt 1,2,3 --max-new-tokens N
      Greedy decoding with model.generate; prints the new ids comma-separated.
  compare GOT EXPECTED [--rtol R]
      Loads both checkpoints with from_pretrained and checks every parameter:
      max|got - expected| <= R * max|expected| (default 1e-4). Prints the worst; exits 1 when
      one is off.
  fixtures DIR
      What the C++ tests share (tests/helpers/hf_models.h): DIR/llama (llama3 RoPE), DIR/qwen2
      (published-checkpoint RoPE keys, 3 shards), DIR/mistral, DIR/tokens.bin (4000 random ids
      < 64), DIR/pattern.bin (4000 ids, each but every 40th following from the one before),
      DIR/prompt.safetensors ("tokens" [2, 16]) and DIR/<arch>_logits.safetensors (each model's
      logits for it).
  batch FILE
      Runs each line of FILE as a command line of this script in one process.

Models load with transformers' sdpa attention; HF_ATTN=eager in the environment loads them with
its eager attention instead (docs/MODELS.md compares the two).
"""
import argparse
import json
import os
import shlex
import sys

import torch


def quiet():
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def config_of(args):
    from transformers import (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
                              Qwen2MoeConfig, Qwen3MoeConfig)

    common = dict(
        vocab_size=args.vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if args.rope == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    elif args.rope == "linear":
        rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    if args.arch == "llama":
        return LlamaConfig(**common, rope_parameters=rope, tie_word_embeddings=False)
    if args.arch == "qwen2":
        return Qwen2Config(**common, rope_parameters=rope, tie_word_embeddings=True)
    # Mixtures of experts: 4 experts, 2 per token, 16 wide.
    moe = dict(num_experts_per_tok=2, output_router_logits=False)
    if args.arch == "qwen2_moe":
        # Layer 1 dense (mlp_only_layers), a shared expert, the top-2 renormalized.
        return Qwen2MoeConfig(**common, rope_parameters=rope, num_experts=4,
                              moe_intermediate_size=16, shared_expert_intermediate_size=24,
                              norm_topk_prob=True, mlp_only_layers=[1], **moe)
    if args.arch == "qwen3_moe":
        return Qwen3MoeConfig(**common, rope_parameters=rope, num_experts=4, head_dim=8,
                              moe_intermediate_size=16, norm_topk_prob=False, **moe)
    if args.arch == "mixtral":
        common = dict(common, intermediate_size=16)
        return MixtralConfig(**common, rope_parameters=rope, num_local_experts=4, **moe)
    return MistralConfig(**common, rope_parameters=rope, sliding_window=None)


def model_class(arch):
    from transformers import (LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
                              Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)

    return {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM,
            "qwen2_moe": Qwen2MoeForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM,
            "mixtral": MixtralForCausalLM}[arch]


MOE_ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral")


def cmd_make(args):
    torch.manual_seed(args.seed)
    model = model_class(args.arch)(config_of(args))
    if args.arch in MOE_ARCHS:
        # Routers drawn with std 1 rather than 0.02: the logits of a token's experts then differ
        # by far more than a rounding, so that no top-k choice flips between two
        # implementations that round differently (the choice is a comparison: a tie broken
        # another way would change the result by a whole expert).
        generator = torch.Generator().manual_seed(args.seed + 100)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                    p.copy_(torch.randn(p.shape, generator=generator))
    dtype = getattr(torch, args.dtype)
    model = model.to(dtype)
    kwargs = {}
    if args.shard_bytes:
        kwargs["max_shard_size"] = args.shard_bytes
    model.save_pretrained(args.dir, **kwargs)
    if args.legacy_rope:
        path = os.path.join(args.dir, "config.json")
        with open(path) as f:
            config = json.load(f)
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        rope_type = rope.pop("rope_type")
        config["rope_scaling"] = None if rope_type == "default" else {"rope_type": rope_type, **rope}
        config["torch_dtype"] = config.pop("dtype")
        with open(path, "w") as f:
            json.dump(config, f, indent=2)


def cmd_tokens(args):
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, args.vocab, (args.count,), generator=generator)
    dtype = {2: "<u2", 4: "<u4"}[args.bytes]
    import numpy

    ids.numpy().astype(dtype).tofile(args.file)


def load(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation=os.environ.get("HF_ATTN", "sdpa")
    )


def cmd_logits(args):
    from safetensors.torch import load_file, save_file

    model = load(args.dir).eval()
    tokens = load_file(args.tokens)["tokens"]
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    save_file({"logits": logits.contiguous()}, args.out)


def read_tokens(path):
    import numpy

    return torch.from_numpy(numpy.fromfile(path, dtype="<u2").astype("int64"))


def cmd_train(args):
    model = load(args.dir).train()
    ids = read_tokens(args.tokens)
    t, n = args.seq_len, args.batch_size
    samples = (ids.numel() - 1) // t
    b1, b2 = (float(x) for x in args.betas.split(","))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(b1, b2), eps=args.eps, weight_decay=args.weight_decay
    )
    per_epoch = (samples + n - 1) // n
    for k in range(args.steps):
        # pipetrain's TokenBatches without --shuffle: batch k % per_epoch of the epoch, wrapping.
        rows = [(((k % per_epoch) * n + i) % samples) for i in range(n)]
        x = torch.stack([ids[s * t : s * t + t] for s in rows])
        y = torch.stack([ids[s * t + 1 : s * t + t + 1] for s in rows])
        optimizer.zero_grad()
        output = model(input_ids=x)
        logits = output.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if getattr(output, "aux_loss", None) is not None:  # a mixture with output_router_logits
            loss = loss + model.config.router_aux_loss_coef * output.aux_loss
        loss.backward()
        optimizer.step()
        print(f"step {k} loss {loss.item():.6f}")
    model.save_pretrained(args.out)


def read_indexed(prefix):
    """The documents (lists of ids) of a Megatron indexed dataset, from its bytes."""
    import numpy

    with open(prefix + ".idx", "rb") as f:
        index = f.read()
    assert index[:9] == b"MMIDIDX\x00\x00", prefix
    code = index[17]
    dtype = {1: numpy.uint8, 4: numpy.int32, 8: numpy.uint16}[code]
    sequences = int(numpy.frombuffer(index, numpy.uint64, 1, 18)[0])
    indices = int(numpy.frombuffer(index, numpy.uint64, 1, 26)[0])
    at = 34
    lengths = numpy.frombuffer(index, numpy.int32, sequences, at)
    at += 4 * sequences
    pointers = numpy.frombuffer(index, numpy.int64, sequences, at)
    at += 8 * sequences
    starts = numpy.frombuffer(index, numpy.int64, indices, at)
    data = numpy.fromfile(prefix + ".bin", dtype=numpy.uint8)
    item = numpy.dtype(dtype).itemsize
    seqs = [numpy.frombuffer(data[p : p + n * item].tobytes(), dtype).astype("int64").tolist()
            for p, n in zip(pointers.tolist(), lengths.tolist())]
    return [sum(seqs[a:b], []) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def document_rows(docs, masks, t, pack):
    """Rows as lists of (id, mask, piece) per id, by pipetrain's packing rules (train-documents)."""
    rows = []
    if pack == "split":
        stream = [(i, m, d) for d, (ids, ms) in enumerate(zip(docs, masks)) for i, m in zip(ids, ms)]
        for r in range((len(stream) - 1) // t):
            rows.append(stream[r * t : r * t + t + 1])
        return rows
    piece = 0
    for ids, ms in zip(docs, masks):
        if len(ids) < 2:
            continue
        for offset in range(0, len(ids) - 1, t):
            rows.append([(i, m, piece) for i, m in zip(ids[offset : offset + t + 1],
                                                         ms[offset : offset + t + 1])])
            piece += 1
    return rows


def cmd_train_documents(args):
    model = load(args.dir).train()
    docs = read_indexed(args.prefix)
    masks = read_indexed(args.mask) if args.mask else [[1] * len(d) for d in docs]
    rows = document_rows(docs, masks, args.seq_len, args.pack)
    n = args.batch_size
    per_epoch = (len(rows) + n - 1) // n
    b1, b2 = (float(x) for x in args.betas.split(","))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(b1, b2), eps=args.eps, weight_decay=args.weight_decay
    )
    for k in range(args.steps):
        batch = [rows[((k % per_epoch) * n + i) % len(rows)] for i in range(n)]
        optimizer.zero_grad()
        total, count = 0.0, 0
        for row in batch:
            ids = [x[0] for x in row]
            targets = [ids[j + 1] if row[j][2] == row[j + 1][2] and row[j + 1][1] else -100
                       for j in range(len(row) - 1)]
            inputs = ids[:-1]
            if args.cross_document:
                runs = [(0, len(inputs))]
            else:
                runs, start = [], 0
                for j in range(1, len(inputs) + 1):
                    if j == len(inputs) or row[j][2] != row[start][2]:
                        runs.append((start, j))
                        start = j
            for a, b in runs:
                logits = model(input_ids=torch.tensor([inputs[a:b]])).logits[0]
                y = torch.tensor(targets[a:b])
                total = total + torch.nn.functional.cross_entropy(
                    logits, y, ignore_index=-100, reduction="sum")
                count += int((y != -100).sum())
        loss = total / count
        loss.backward()
        optimizer.step()
        print(f"step {k} loss {loss.item():.6f}")
    model.save_pretrained(args.out)


def cmd_eval(args):
    model = load(args.dir).eval()
    ids = read_tokens(args.tokens)
    t = args.seq_len
    samples = (ids.numel() - 1) // t
    x = torch.stack([ids[s * t : s * t + t] for s in range(samples)])
    y = torch.stack([ids[s * t + 1 : s * t + t + 1] for s in range(samples)])
    with torch.no_grad():
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    print(f"loss {loss.item():.6f} perplexity {loss.exp().item():.4f}")


def cmd_generate(args):
    model = load(args.dir).eval()
    prompt = torch.tensor([[int(x) for x in args.prompt.split(",")]])
    out = model.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
    print(",".join(str(int(x)) for x in out[0, prompt.size(1) :]))


def cmd_aux(args):
    from safetensors.torch import load_file
    from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

    logits = load_file(args.file)["logits"]
    value = load_balancing_loss_func((logits,), logits.size(-1), args.top_k)
    print(f"aux {value.item():.9g}")


def cmd_compare(args):
    got = dict(load(args.got).named_parameters())
    expected = dict(load(args.expected).named_parameters())
    if set(got) != set(expected):
        print("names differ:", sorted(set(got) ^ set(expected)))
        sys.exit(1)
    worst, worst_name = 0.0, ""
    for name, e in expected.items():
        g = got[name]
        scale = e.abs().max().item() or 1.0
        error = (g - e).abs().max().item() / scale
        if error > worst:
            worst, worst_name = error, name
    print(f"worst relative error {worst:.3g} ({worst_name})")
    if worst > args.rtol:
        sys.exit(1)


def cmd_fixtures(args):
    from safetensors.torch import save_file

    d = args.dir
    run(["make", f"{d}/llama", "--arch", "llama", "--rope", "llama3", "--seed", "1"])
    run(["make", f"{d}/qwen2", "--arch", "qwen2", "--legacy-rope", "--shard-bytes", "30000",
         "--seed", "2"])
    run(["make", f"{d}/mistral", "--arch", "mistral", "--seed", "3"])
    for seed, arch in enumerate(MOE_ARCHS, start=7):
        run(["make", f"{d}/{arch}", "--arch", arch, "--seed", str(seed)])
    run(["tokens", f"{d}/tokens.bin", "--count", "4000", "--vocab", "64", "--seed", "4"])
    # A learnable stream: each id follows from the one before (5x + 3 mod 64), restarting at a
    # random id every 40 ids.
    generator = torch.Generator().manual_seed(6)
    ids = []
    for _ in range(100):
        x = int(torch.randint(0, 64, (1,), generator=generator))
        for _ in range(40):
            ids.append(x)
            x = (5 * x + 3) % 64
    import numpy

    numpy.array(ids, dtype="<u2").tofile(f"{d}/pattern.bin")
    generator = torch.Generator().manual_seed(5)
    save_file({"tokens": torch.randint(0, 64, (2, 16), generator=generator)},
              f"{d}/prompt.safetensors")
    for arch in ("llama", "qwen2", "mistral") + MOE_ARCHS:
        run(["logits", f"{d}/{arch}", f"{d}/prompt.safetensors", f"{d}/{arch}_logits.safetensors"])


def parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--arch", choices=["llama", "qwen2", "mistral"] + list(MOE_ARCHS), required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--vocab", type=int, default=64)
    m.add_argument("--shard-bytes", type=int, default=0)
    m.add_argument("--dtype", default="float32")
    m.add_argument("--rope", default="default")
    m.add_argument("--legacy-rope", action="store_true")
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--bytes", type=int, default=2)
    lg = sub.add_parser("logits")
    lg.add_argument("dir")
    lg.add_argument("tokens")
    lg.add_argument("out")
    tr = sub.add_parser("train")
    tr.add_argument("dir")
    tr.add_argument("tokens")
    tr.add_argument("out")
    tr.add_argument("--seq-len", type=int, required=True)
    tr.add_argument("--batch-size", type=int, required=True)
    tr.add_argument("--steps", type=int, required=True)
    tr.add_argument("--lr", type=float, required=True)
    tr.add_argument("--betas", default="0.9,0.999")
    tr.add_argument("--eps", type=float, default=1e-8)
    tr.add_argument("--weight-decay", type=float, default=0.0)
    td = sub.add_parser("train-documents")
    td.add_argument("dir")
    td.add_argument("prefix")
    td.add_argument("out")
    td.add_argument("--mask", default="")
    td.add_argument("--pack", choices=["split", "none"], default="split")
    td.add_argument("--cross-document", action="store_true")
    td.add_argument("--seq-len", type=int, required=True)
    td.add_argument("--batch-size", type=int, required=True)
    td.add_argument("--steps", type=int, required=True)
    td.add_argument("--lr", type=float, required=True)
    td.add_argument("--betas", default="0.9,0.999")
    td.add_argument("--eps", type=float, default=1e-8)
    td.add_argument("--weight-decay", type=float, default=0.0)
    ev = sub.add_parser("eval")
    ev.add_argument("dir")
    ev.add_argument("tokens")
    ev.add_argument("--seq-len", type=int, required=True)
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, required=True)
    a = sub.add_parser("aux")
    a.add_argument("file")
    a.add_argument("--top-k", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("got")
    c.add_argument("expected")
    c.add_argument("--rtol", type=float, default=1e-4)
    fx = sub.add_parser("fixtures")
    fx.add_argument("dir")
    b = sub.add_parser("batch")
    b.add_argument("file")
    return p


COMMANDS = {
    "make": cmd_make,
    "tokens": cmd_tokens,
    "logits": cmd_logits,
    "train": cmd_train,
    "train-documents": cmd_train_documents,
    "eval": cmd_eval,
    "generate": cmd_generate,
    "compare": cmd_compare,
    "fixtures": cmd_fixtures,
    "aux": cmd_aux,
}


def run(argv):
    args = parser().parse_args(argv)
    if args.command == "batch":
        with open(args.file) as f:
            for line in f:
                if line.strip():
                    run(shlex.split(line))
        return
    COMMANDS[args.command](args)


if __name__ == "__main__":
    quiet()
    run(sys.argv[1:])
