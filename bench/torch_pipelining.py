#!/usr/bin/env python3
"""The torch.distributed.pipelining peer for `pipetrain bench`.

Trains the bench suites' MLPs, or transformers' own LlamaForCausalLM (--suite llama), with
PyTorch's own pipeline parallelism (PipelineStage and one of
ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleLoopedBFS,
ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV) on the CPU, one process per pipeline rank,
talking over Gloo. Launch it with torchrun, one process per rank, on loopback only:

  GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port PORT \
      -- bench/torch_pipelining.py --suite mlp --schedule 1f1b --chunks 8 --threads 1

The `--` matters: without it torchrun's own parser takes --virtual for an abbreviation of its
--virtual-local-rank and stops.

The model is a list of layers (every Linear and every ReLU is one layer) cut into K*V contiguous
stages with pipetrain's default balance: with L layers and S stages, stage j gets L//S layers, plus
one if j < L % S. K is the number of processes, V the stages per process (--virtual). Stage j lives
on rank j % K, except for zb-v and dualpipev, where rank r holds stages r and 2K-1-r (a V shape).
For those the
stages drop torch's warm-up messages from a rank to itself, which Gloo rejects (GlooPipelineStage).

One training step is: zero_grad, schedule.step (rank 0 feeds the whole batch, the rank holding the
last stage gives the target), SGD step on every rank over its own stages' parameters. The loss is
the MSE mean per micro-batch; the schedule divides the accumulated gradients by the number of
micro-batches (scale_grads=True), so with equal micro-batches (the batch must be a multiple of
--chunks) the gradient is exactly that of the full-batch mean loss.

Rank 0 prints one line to stdout: PIPETRAIN_BENCH_RESULT {json}, where step_seconds is the median
over the timed steps of the slowest rank's time for that step. Everything else goes to stderr.

The llama suite's model is LlamaForCausalLM of the config bench_options.cpp's llama_bench_config
writes (the same fields here, LLAMA_CONFIG), cut into its entries as pipetrain cuts its Llama:
the embedding, each decoder layer (with transformers' rotary embedding computed in the entry),
the final norm, the head; the loss is the mean cross-entropy of the logits over random ids.

Tensor parallelism (--tp T, llama only): torch's own 2-D composition of pipeline and tensor
parallelism. The world is K*T processes (torchrun --nproc-per-node K*T) on a 2-D DeviceMesh
(init_device_mesh("cpu", (K, T), mesh_dim_names=("pp", "tp")), Gloo) in Megatron's order: the
tensor-parallel ranks are adjacent, global rank = pp_rank * T + tp_rank. Every rank builds the same
seeded stages for its pp_rank as with T = 1 (and loads --init-params into them), then splits them
over its "tp" sub-mesh with torch.distributed.tensor.parallel.parallelize_module, without sequence
parallelism: in each decoder layer q_proj, k_proj, v_proj, gate_proj and up_proj by output
features (ColwiseParallel), o_proj and down_proj by input features (RowwiseParallel); the
embedding by vocabulary rows (RowwiseParallel, replicated input); the head by vocabulary columns
(ColwiseParallel with output_layouts=Replicate(), so the logits are all-gathered and the loss is
the plain cross-entropy; Shard(-1) logits with loss_parallel around schedule.step also work in
torch 2.11 but would make the last stage's output a DTensor). The norms stay whole on every rank.
LlamaAttention reshapes with -1 heads, so a rank runs its 8/T query and 4/T key-value heads as is.
The PipelineStages talk over the "pp" sub-mesh's process group (K ranks, the same tp_rank); what
they pass between pipeline ranks is the plain, replicated hidden state. SGD updates the local
(DTensor) shards. The result line's "stages" is K, its "tp" T, step_seconds the median of the
slowest of all K*T ranks; --save-params gathers the shards whole (DTensor.full_tensor()), so the
file has T = 1's names and shapes. --threads is per process, as without --tp.

Transparency mode: --init-params, --inputs/--targets and --save-params replace the random weights
and data with files and save the trained weights (names as in the full nn.Sequential), for
comparison with `pipetrain train` on the model written by --make-fixture (one plain process, no
torchrun).
"""
import argparse
import collections
import datetime
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch import nn

# Suite name -> (Linear+ReLU blocks, default width, default batch); llama: decoder layers.
SUITES = {"mlp": (8, 1024, 256), "small": (16, 256, 64), "llama": (8, 256, 16),
          "moe": (4, 256, 16)}
HF_SUITES = {"llama", "moe"}  # transformers' own decoders
LLAMA_SEQ_LEN = 128  # bench_options.h, kLlamaSeqLen


def llama_config(width):
    """bench_options.cpp's llama_bench_config(width), for transformers."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=4096, hidden_size=width,
                       intermediate_size=(width * 8 // 3 + 15) // 16 * 16, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=width // 8,
                       max_position_embeddings=LLAMA_SEQ_LEN, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       tie_word_embeddings=False)

def moe_config(width):
    """bench/harness/moe_suite.cpp's moe_bench_config(width), for transformers: Qwen3-MoE of 4
    layers, 8 experts of width `width`, 2 per token."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=4096, hidden_size=width, intermediate_size=width * 3,
                          moe_intermediate_size=width, num_experts=8, num_experts_per_tok=2,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=width // 8, max_position_embeddings=LLAMA_SEQ_LEN,
                          rms_norm_eps=1e-5,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          tie_word_embeddings=False, output_router_logits=False)


# --schedule -> torch.distributed.pipelining class name.
SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
V_SHAPED_SCHEDULES = {"zb-v", "dualpipev"}
SINGLE_STAGE_SCHEDULES = {"gpipe", "1f1b"}

RESULT_PREFIX = "PIPETRAIN_BENCH_RESULT "


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="torch.distributed.pipelining peer for `pipetrain bench` (launch with "
                    "torchrun; see the module docstring).")
    parser.add_argument("--suite", default="mlp", choices=sorted(SUITES),
                        help="mlp: 8 x [Linear(1024,1024), ReLU], batch 256; "
                             "small: 16 x [Linear(256,256), ReLU], batch 64; MSE loss; llama: "
                             "transformers' LlamaForCausalLM, 8 layers, 16 sequences of 128 ids")
    parser.add_argument("--width", type=int, default=0,
                        help="features of every Linear (0: the suite's default)")
    parser.add_argument("--batch", type=int, default=0,
                        help="rows per step (0: the suite's default; ignored with --inputs)")
    parser.add_argument("--schedule", default="1f1b", choices=list(SCHEDULES),
                        help="pipeline schedule")
    parser.add_argument("--virtual", type=int, default=1,
                        help="stages per rank: 1 for gpipe/1f1b, >= 2 for interleaved-1f1b, "
                             "looped-bfs and interleaved-zb, exactly 2 for zb-v and dualpipev")
    parser.add_argument("--chunks", type=int, default=8,
                        help="micro-batches per step (must divide the batch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads on every rank (0: leave as is; note that "
                             "torchrun sets OMP_NUM_THREADS=1 unless it is already set)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="process-group timeout in seconds, so that a hang ends in an error")
    parser.add_argument("--init-params", metavar="FILE",
                        help="torch.save'd {name: tensor} of the full nn.Sequential to start "
                             "from, instead of the random init")
    parser.add_argument("--inputs", metavar="X.pt",
                        help="torch.save'd input tensor; every step uses all its rows")
    parser.add_argument("--targets", metavar="Y.pt", help="torch.save'd target tensor")
    parser.add_argument("--save-params", metavar="OUT.pt",
                        help="after training (--warmup + --steps steps), rank 0 saves the full "
                             "model's {name: tensor}")
    parser.add_argument("--load-csv", metavar="FILE",
                        help="run the compute-only CSV schedule in FILE (as `pipetrain plan "
                             "--save FILE.csv` writes it) instead of --schedule's own lists; "
                             "--schedule still picks the placement (zb-v: the V shape)")
    parser.add_argument("--dump-csv", metavar="FILE",
                        help="rank 0 writes the compute-only action lists the runtime runs "
                             "(after --load-csv, if given) to FILE")
    parser.add_argument("--trace", action="store_true",
                        help="time every forward, backward (B, or I when split) and weight "
                             "gradient (W) of the timed steps; each rank prints the median per "
                             "stage and action to stderr (TRACE lines), the compute alone, "
                             "without the waits for messages")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel ranks per pipeline rank (llama only): the world is "
                             "K*T ranks on a (pp, tp) DeviceMesh, tensor-parallel ranks adjacent")
    parser.add_argument("--make-fixture", metavar="DIR",
                        help="no training, no torchrun: write DIR/init.pt, DIR/x.pt, DIR/y.pt and "
                             "DIR/model.pt (TorchScript nn.Sequential with those weights)")
    args = parser.parse_args(argv)
    blocks, width, batch = SUITES[args.suite]
    args.layers = blocks + 3 if args.suite in HF_SUITES else 2 * blocks
    args.width = args.width or width
    args.batch = args.batch or batch
    if (args.inputs is None) != (args.targets is None):
        parser.error("--inputs and --targets go together")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.tp < 1:
        parser.error("--tp must be >= 1")
    if args.tp > 1 and args.suite != "llama":
        parser.error("--tp > 1 needs --suite llama")
    return args


def check_pipeline_shape(args, ranks):
    """Raises ValueError when --schedule, --virtual, --chunks and the batch do not fit together."""
    if args.schedule in SINGLE_STAGE_SCHEDULES and args.virtual != 1:
        raise ValueError(f"{args.schedule} runs one stage per rank; --virtual must be 1")
    if args.schedule in V_SHAPED_SCHEDULES and args.virtual != 2:
        raise ValueError(f"{args.schedule} needs exactly two stages per rank: --virtual 2")
    if args.schedule not in SINGLE_STAGE_SCHEDULES and args.virtual < 2:
        raise ValueError(f"{args.schedule} needs --virtual >= 2")
    if ranks * args.virtual > args.layers:
        raise ValueError(f"{ranks * args.virtual} stages for {args.layers} layers")
    if args.batch % args.chunks != 0:
        raise ValueError(f"--chunks {args.chunks} must divide the batch ({args.batch}) for the "
                         "micro-batch mean losses to add up to the full-batch mean")


def stage_bounds(layers, stages):
    """pipetrain's default balance: [start, end) of each stage's slice of the layer list."""
    base, extra = divmod(layers, stages)
    bounds, start = [], 0
    for j in range(stages):
        end = start + base + (1 if j < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def stage_rank(stage, ranks, schedule):
    """The rank holding a stage: looped (j % K), or V-shaped for zb-v (r holds r and 2K-1-r)."""
    if schedule in V_SHAPED_SCHEDULES and stage >= ranks:
        return 2 * ranks - 1 - stage
    return stage % ranks


def make_layer(index, width, seed):
    """Layer `index` of the suite: even ones Linear(width, width), odd ones ReLU. Each Linear is
    drawn from its own generator (nn.Linear's default distribution, U(+-1/sqrt(width))), so a rank
    builds its own layers without drawing everybody else's."""
    if index % 2 == 1:
        return nn.ReLU()
    linear = nn.Linear(width, width)
    generator = torch.Generator().manual_seed((seed << 16) + index + 1)
    bound = width ** -0.5
    with torch.no_grad():
        linear.weight.uniform_(-bound, bound, generator=generator)
        linear.bias.uniform_(-bound, bound, generator=generator)
    return linear


def make_stage_module(start, end, width, seed):
    """Layers [start, end) as an nn.Sequential whose children keep their full-model indices, so its
    state_dict names ("4.weight", ...) are those of the full nn.Sequential."""
    return nn.Sequential(collections.OrderedDict(
        (str(i), make_layer(i, width, seed)) for i in range(start, end)))


class LlamaEntry(nn.Module):
    """One pipeline entry of transformers' Llama: the embedding, a decoder layer (its rotary
    tables computed here from the positions, as LlamaModel.forward does), the norm or the head."""

    def __init__(self, kind, module, rotary=None):
        super().__init__()
        self.kind, self.module, self.rotary = kind, module, rotary

    def forward(self, x):
        if self.kind != "layer":
            return self.module(x)
        positions = torch.arange(x.size(1), device=x.device).unsqueeze(0)
        return self.module(x, attention_mask=None, position_embeddings=self.rotary(x, positions))


def make_llama_stage(start, end, width, seed, suite="llama"):
    """Entries [start, end) of the llama suite's LlamaForCausalLM, or the moe suite's
    Qwen3MoeForCausalLM (seeded: every rank draws the same model and keeps its own entries)."""
    from transformers import LlamaForCausalLM, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    model = (Qwen3MoeForCausalLM(moe_config(width)) if suite == "moe"
             else LlamaForCausalLM(llama_config(width)))
    rotary = model.model.rotary_emb
    entries = ([LlamaEntry("embed", model.model.embed_tokens)]
               + [LlamaEntry("layer", layer, rotary) for layer in model.model.layers]
               + [LlamaEntry("norm", model.model.norm), LlamaEntry("head", model.lm_head)])
    return nn.Sequential(collections.OrderedDict((str(i), entries[i]) for i in range(start, end)))


def make_pp_tp_mesh(world, tp):
    """The 2-D (pp, tp) DeviceMesh of --tp: shape (K, T) in Megatron's order, global rank =
    pp_rank * T + tp_rank. Returns this rank's pipeline process group (the K ranks with its
    tp_rank) and its tensor-parallel sub-mesh (the T ranks with its pp_rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    if world % tp != 0:
        raise ValueError(f"--tp {tp} must divide the world size ({world})")
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("pp", "tp"))
    return mesh["pp"].get_group(), mesh["tp"]


def parallelize_llama_stage(module, tp_mesh):
    """Splits a llama stage's entries over the tp mesh with parallelize_module, without sequence
    parallelism: in every decoder layer q/k/v_proj and gate/up_proj by output features
    (ColwiseParallel), o_proj and down_proj by input features (RowwiseParallel, all-reduced to a
    replicated output); the embedding by vocabulary rows (RowwiseParallel of a replicated input);
    the head by vocabulary columns, all-gathered to replicated logits. The norms stay whole. Every
    entry takes and returns plain, replicated tensors. LlamaAttention reshapes its projections
    with -1 heads, so each rank runs its own 8/T query and 4/T key-value heads unchanged (the
    query-per-key-value ratio, num_key_value_groups, is the same)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    plan = {}
    for name, entry in module.named_children():
        prefix = f"{name}.module"
        if entry.kind == "embed":
            plan[prefix] = RowwiseParallel(input_layouts=Replicate())
        elif entry.kind == "head":
            plan[prefix] = ColwiseParallel(output_layouts=Replicate())
        elif entry.kind == "layer":
            for proj in ("q_proj", "k_proj", "v_proj"):
                plan[f"{prefix}.self_attn.{proj}"] = ColwiseParallel()
            plan[f"{prefix}.self_attn.o_proj"] = RowwiseParallel()
            for proj in ("gate_proj", "up_proj"):
                plan[f"{prefix}.mlp.{proj}"] = ColwiseParallel()
            plan[f"{prefix}.mlp.down_proj"] = RowwiseParallel()
    if plan:
        parallelize_module(module, tp_mesh, plan)


def llama_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def random_data(batch, width, seed, suite="mlp"):
    generator = torch.Generator().manual_seed(seed)
    if suite in HF_SUITES:
        x = torch.randint(0, 4096, (batch, LLAMA_SEQ_LEN), generator=generator)
        return x, torch.randint(0, 4096, (batch, LLAMA_SEQ_LEN), generator=generator)
    x = torch.randn(batch, width, generator=generator)
    y = torch.randn(batch, width, generator=generator)
    return x, y


def load_data(args):
    """The batch: the --inputs/--targets files, or random rows from --seed (the same on every rank).
    Sets args.batch to the rows used."""
    if args.inputs is None:
        return random_data(args.batch, args.width, args.seed, args.suite)
    x, y = torch.load(args.inputs), torch.load(args.targets)
    if x.size(0) != y.size(0):
        raise ValueError(f"{args.inputs} has {x.size(0)} rows, {args.targets} {y.size(0)}")
    args.batch = x.size(0)
    return x, y


def load_init_params(modules, path):
    """Loads each stage module's share of a full-model {name: tensor} file."""
    params = torch.load(path)
    for module in modules:
        module.load_state_dict({name: params[name] for name in module.state_dict()})


class GlooPipelineStage(pipelining.PipelineStage):
    """PipelineStage minus the warm-up send/recv to its own rank. Before the first step every stage
    exchanges a dummy tensor with its neighbours; in zb-v's V, stages K-1 and K share rank K-1, so
    torch 2.11 posts a send and a recv to the rank itself, which Gloo cannot pair ("Pair is not
    connected"). Those two stages hand tensors over in memory at run time, so the self-pair ops
    carry nothing and are dropped; for every other stage the list is unchanged."""

    def _get_init_p2p_neighbors_ops(self):
        return [op for op in super()._get_init_p2p_neighbors_ops()
                if op.group_peer != self.group_rank]


def trace_actions(stages, record):
    """Wraps each stage's forward_one_chunk, backward_one_chunk and backward_weight_one_chunk so
    that every call appends (stage, action, seconds) to `record`. The schedule waits for a
    chunk's messages before it calls these, so the times are the compute (and the stage's own
    bookkeeping) alone. The last stage's loss is computed outside forward_one_chunk."""
    def timed(original, stage_index, action_of):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                record.append((stage_index, action_of(kwargs), time.perf_counter() - start))
        return run

    for stage in stages:
        j = stage.stage_index
        stage.forward_one_chunk = timed(stage.forward_one_chunk, j, lambda kwargs: "F")
        stage.backward_one_chunk = timed(
            stage.backward_one_chunk, j,
            lambda kwargs: "B" if kwargs.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, j,
                                                lambda kwargs: "W")


def print_trace(rank, record, steps):
    """One TRACE line per stage and action on stderr: median ms, calls per step."""
    by_action = collections.defaultdict(list)
    for stage_index, action, seconds in record:
        by_action[(stage_index, action)].append(seconds)
    for (stage_index, action), times in sorted(by_action.items()):
        print(f"TRACE rank {rank} stage {stage_index} {action} median "
              f"{statistics.median(times) * 1e3:.3f} ms, {len(times) / steps:g} per step",
              file=sys.stderr, flush=True)


def make_schedule(args, stages):
    name = SCHEDULES[args.schedule]
    schedule_class = getattr(pipelining, name, None)
    if schedule_class is None:
        raise RuntimeError(f"torch {torch.__version__} has no {name}")
    stage_arg = stages[0] if args.schedule in SINGLE_STAGE_SCHEDULES else stages
    loss_fn = llama_loss if args.suite in HF_SUITES else nn.functional.mse_loss
    schedule = schedule_class(stage_arg, n_microbatches=args.chunks, loss_fn=loss_fn,
                              scale_grads=True)
    if args.load_csv:
        # Replace the class's own action lists by the file's (compute-only; torch adds the
        # sends and receives). The class still gives the placement and the runtime.
        schedule._load_csv(args.load_csv, format="compute_only")
    return schedule


def train_step(schedule, optimizer, x, y, first, last):
    """One step on this rank; returns its wall time in seconds."""
    start = time.perf_counter()
    if optimizer is not None:
        optimizer.zero_grad()
    inputs = (x,) if first else ()
    if last:
        schedule.step(*inputs, target=y, losses=[], return_outputs=False)
    else:
        schedule.step(*inputs, return_outputs=False)
    if optimizer is not None:
        optimizer.step()
    return time.perf_counter() - start


def gather_to_rank0(obj):
    """Every rank's obj, in rank order, on rank 0 (None elsewhere)."""
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def full_tensor(tensor):
    """The whole tensor of a --tp shard (a DTensor; a collective over its tp ranks), else itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def stage_params(modules):
    """{full-model name: detached copy} of the modules' parameters (--tp shards gathered whole)."""
    return {name: full_tensor(tensor.detach()).clone()
            for module in modules for name, tensor in module.state_dict().items()}


def save_full_params(per_rank, path):
    """Merges the ranks' {name: tensor} into full-Sequential order ("0.weight", "0.bias", "2...")
    and saves it."""
    merged = {name: tensor for params in per_rank for name, tensor in params.items()}
    ordered = dict(sorted(merged.items(), key=lambda item: int(item[0].split(".")[0])))
    torch.save(ordered, path)


def result_line(args, schedule, ranks, per_rank_times, per_rank_rss):
    """`ranks` pipeline ranks (K); per_rank_* hold all K*T ranks' values."""
    step_max = [max(times[s] for times in per_rank_times) for s in range(args.steps)]
    return RESULT_PREFIX + json.dumps({
        "runtime": "torch-pipelining", "suite": args.suite, "schedule": args.schedule,
        "stages": ranks, "tp": args.tp, "virtual_stages": args.virtual, "chunks": args.chunks,
        "batch": args.batch, "threads": torch.get_num_threads(),
        "step_seconds": statistics.median(step_max), "step_seconds_all": step_max,
        "steps": args.steps, "peak_rss_bytes": max(per_rank_rss),
        "torch_version": torch.__version__, "torch_schedule": type(schedule).__name__,
    })


def run_pipeline(args):
    rank = dist.get_rank()
    # --tp > 1: the stages talk over this rank's pp group (None: the world, as with --tp 1).
    pp_group, tp_mesh = (None, None) if args.tp == 1 else make_pp_tp_mesh(dist.get_world_size(),
                                                                           args.tp)
    pp_rank, ranks = dist.get_rank(pp_group), dist.get_world_size(pp_group)
    x, y = load_data(args)
    check_pipeline_shape(args, ranks)
    num_stages = ranks * args.virtual
    mine = [j for j in range(num_stages) if stage_rank(j, ranks, args.schedule) == pp_rank]
    bounds = stage_bounds(args.layers, num_stages)
    if args.suite in HF_SUITES:
        modules = [make_llama_stage(*bounds[j], args.width, args.seed, args.suite) for j in mine]
    else:
        modules = [make_stage_module(*bounds[j], args.width, args.seed) for j in mine]
    if args.init_params:
        load_init_params(modules, args.init_params)
    if tp_mesh is not None:
        for module in modules:
            parallelize_llama_stage(module, tp_mesh)
    device = torch.device("cpu")
    stages = [GlooPipelineStage(module, j, num_stages, device, group=pp_group)
              for j, module in zip(mine, modules)]
    schedule = make_schedule(args, stages)
    if args.dump_csv and rank == 0:
        # The compute-only lists the runtime runs, as its _dump_csv writes them.
        schedule._dump_csv(args.dump_csv, format="compute_only")
    params = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr) if params else None
    first, last = 0 in mine, num_stages - 1 in mine

    record = []
    if args.trace:
        trace_actions(stages, record)
    times = [train_step(schedule, optimizer, x, y, first, last) for _ in range(args.warmup)]
    record.clear()
    times = [train_step(schedule, optimizer, x, y, first, last) for _ in range(args.steps)]
    if args.trace:
        print_trace(rank, record, args.steps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    per_rank_times, per_rank_rss = gather_to_rank0(times), gather_to_rank0(rss)
    if args.save_params:
        per_rank_params = gather_to_rank0(stage_params(modules))
        if rank == 0:
            save_full_params(per_rank_params, args.save_params)
    if rank == 0:
        print(result_line(args, schedule, ranks, per_rank_times, per_rank_rss), flush=True)


def make_fixture(args):
    """Writes DIR/init.pt, DIR/x.pt, DIR/y.pt and DIR/model.pt for the transparency test."""
    os.makedirs(args.make_fixture, exist_ok=True)
    model = nn.Sequential(*[make_layer(i, args.width, args.seed) for i in range(args.layers)])
    x, y = random_data(args.batch, args.width, args.seed)
    torch.save(stage_params([model]), os.path.join(args.make_fixture, "init.pt"))
    torch.save(x, os.path.join(args.make_fixture, "x.pt"))
    torch.save(y, os.path.join(args.make_fixture, "y.pt"))
    torch.jit.save(torch.jit.script(model), os.path.join(args.make_fixture, "model.pt"))


def main(argv):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.make_fixture:
        make_fixture(args)
        return 0
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        run_pipeline(args)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
