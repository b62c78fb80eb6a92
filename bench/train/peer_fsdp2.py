#!/usr/bin/env python3
"""The PyTorch peer of bench/train/train_bench.cpp: HF transformers LlamaForCausalLM (sdpa
attention) wrapped with FSDP2 `fully_shard` (per block, then the root), bf16 parameters
with f32 gradient reduction, fused AdamW, optional torch.compile per block and full
activation checkpointing per block. Same shape, batch, random tokens and step count as
train_bench; prints the same table row and JSON line (tokens/s and MFU per GPU).
With --cpu-offload, FSDP2's CPUOffloadPolicy keeps the sharded parameters, gradients and
AdamW state in host memory and the fused AdamW runs on the CPU (the peer of train_bench
--offload, the trainer's parallel.offload).
With --offload-activations (needs --ac full), each block's checkpointed input goes to pinned
host memory through torch.autograd.graph.save_on_cpu around the block alone: the block is
checkpointed with use_reentrant=True so that its input is a saved tensor the hook moves (the peer of
train_bench --offload-activations, the trainer's training.offload_activations).
With --tp N (under torchrun), torchtitan's 2-D plan on the same model: groups of N GPUs split
each block with DTensor tensor parallelism (q, k, v, gate, up column-parallel; o, down
row-parallel) and sequence parallelism (the norms and the residual stream on 1/N of the token
rows; the embedding row-parallel into sequence shards, the head column-parallel over the
vocabulary with loss_parallel), FSDP2 over the data-parallel dimension; the peer of
train_bench --tp N, the trainer's parallel.tensor_parallel. The blocks then run as torchtitan
runs its own: the embedding, each block and the head called in turn with rope for all the
rows (HF's LlamaModel.forward would take the rope positions from a rank's share of them).
One rank by default; under torchrun, one rank per GPU (--batch is per data-parallel rank;
tokens/s and MFU per GPU). Where the
driver's NVML is there, it also reports the board's mean power, SM clock, power-capped share
and energy per token over the timed steps, as train_bench does.

  python3 bench/train/peer_fsdp2.py [--batch 4] [--seq 4096] [--steps 10] [--warmup 3]
                                    [--compile] [--ac none|full] [--shape 1b|8b|405b] [--layers N]
                                    [--cpu-offload]
                                    [--offload-activations]
  torchrun --nproc-per-node 2 bench/train/peer_fsdp2.py --shape 8b --batch 1 ...
  torchrun --nproc-per-node 2 bench/train/peer_fsdp2.py --tp 2 --batch 8 ...
  torchrun --nproc-per-node 2 bench/train/peer_fsdp2.py --replicate 2 --batch 4 ...   # HSDP (here DDP)
--device cpu (gloo, f32, with --shape tiny) checks the script on a machine without a GPU; it
times nothing worth reporting.
"""
import argparse
import ctypes
import json
import math
import os
import threading
import time

import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


class Board:
    """The GPU's energy counter, SM clock and power-cap state through NVML (the driver's
    libnvidia-ml, by ctypes), as train_bench reads them (core/gpu_monitor.h): mean power and
    energy over an interval, the clock and the power-capped share sampled every 50 ms by a
    thread. finish() gives {} where NVML or its energy counter is unavailable."""

    SW_POWER_CAP = 0x4

    def __init__(self, device_index):
        self.handle = None
        self.samples, self.stop = [], threading.Event()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() != 0:
                return
            props = torch.cuda.get_device_properties(device_index)
            handle = ctypes.c_void_p()
            if hasattr(props, "pci_bus_id"):
                bus = f"{getattr(props, 'pci_domain_id', 0):08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
                found = nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) == 0
            else:
                found = nvml.nvmlDeviceGetHandleByIndex_v2(device_index, ctypes.byref(handle)) == 0
            # the clock event reasons were called throttle reasons before driver 535
            reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            if found:
                self.nvml, self.handle, self.reasons = nvml, handle, reasons
        except (OSError, AttributeError):
            pass

    def _energy_mj(self):
        e = ctypes.c_ulonglong()
        return e.value if self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(e)) == 0 else None

    def _sample(self):
        while not self.stop.is_set():
            mhz, reasons = ctypes.c_uint(), ctypes.c_ulonglong()
            if self.nvml.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz)) == 0:  # 1: NVML_CLOCK_SM
                if self.reasons(self.handle, ctypes.byref(reasons)) != 0:
                    reasons.value = 0
                self.samples.append((mhz.value, reasons.value))
            self.stop.wait(0.05)

    def start(self):
        if self.handle is None:
            return
        self.t0, self.e0 = time.perf_counter(), self._energy_mj()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def finish(self, tokens):
        """Readings since start(): mean power (W), SM clock (MHz), power-capped share and
        energy per token (mJ), or {} without NVML."""
        if self.handle is None:
            return {}
        self.stop.set()
        self.thread.join()
        seconds, e1 = time.perf_counter() - self.t0, self._energy_mj()
        # the counter advances in steps of ~0.1 s: under 2 s the mean power is too coarse
        if self.e0 is None or e1 is None or not self.samples or seconds < 2.0:
            return {}
        joules = (e1 - self.e0) / 1000
        return dict(gpu_power_w=round(joules / seconds, 1),
                    gpu_sm_mhz=round(sum(m for m, _ in self.samples) / len(self.samples)),
                    gpu_power_capped=round(sum(1 for _, r in self.samples if r & self.SW_POWER_CAP)
                                           / len(self.samples), 3),
                    mj_per_token=round(1000 * joules / tokens, 3))


def offloaded_checkpoint(forward):
    """A block's forward checkpointed with its input saved in pinned host memory: reentrant, so
    that the input is a saved tensor that save_on_cpu's hooks move (the keyword arguments, the
    rotary tables and masks every block shares, stay in the closure on the GPU)."""
    def run(*args, **kwargs):
        hidden = args[0] if args else kwargs.pop("hidden_states")
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return checkpoint(lambda h: forward(h, *args[1:], **kwargs), hidden, use_reentrant=True)
    return run


def parallelize_2d(model, tp, world, device):
    """torchtitan's tensor- and sequence-parallel plan (its parallelize_llama) on HF's Llama:
    returns the data-parallel mesh for fully_shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh(device, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    tied = model.config.tie_word_embeddings
    parallelize_module(model, mesh["tp"], {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    if tied:  # both split the [V, D] table by rows: the same DTensor serves both again
        model.lm_head.weight = model.model.embed_tokens.weight
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return mesh["dp"]


def forward_2d(model):
    """The 2-D model's forward, in place of LlamaForCausalLM.forward (so that FSDP2's hooks on
    the root still gather its parameters): the embedding, the blocks with rope for all T rows,
    the final norm and the vocabulary-parallel head; returns the logits [B, T, V / tp] as a
    DTensor."""
    base = model.model

    def forward(ids):
        h = base.embed_tokens(ids)  # this rank's share of the rows [B, T / tp, D]
        positions = torch.arange(ids.shape[1], device=ids.device)[None]
        rope = base.rotary_emb(h, positions)  # cos, sin of every row: the attention sees them all
        for layer in base.layers:
            h = layer(h, position_embeddings=rope, attention_mask=None)
        return model.lm_head(base.norm(h))
    return forward


def step_2d(model, ids, labels):
    """Forward and backward of the 2-D model with loss_parallel's cross-entropy over the
    next-token targets (HF's shift: the last position has none)."""
    from torch.distributed.tensor.parallel import loss_parallel
    logits = model(ids)
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    with loss_parallel():
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        loss.backward()
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


# The published config.json of the models shardtrain has as model.preset (their shape keys).
PUBLISHED = {
    "qwen3-1.7b": dict(model_type="qwen3", hidden_act="silu", vocab_size=151936, hidden_size=2048,
                       intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=40960, max_window_layers=28, rms_norm_eps=1e-6,
                       rope_scaling=None, rope_theta=1000000, sliding_window=None, use_sliding_window=False,
                       tie_word_embeddings=True, attention_bias=False, initializer_range=0.02),
    "gemma3-1b": dict(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", vocab_size=262144,
                      hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, query_pre_attn_scalar=256,
                      rms_norm_eps=1e-6, rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000,
                      sliding_window=512, sliding_window_pattern=6, attn_logit_softcapping=None,
                      final_logit_softcapping=None, attention_bias=False, initializer_range=0.02),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--ac", choices=["none", "full"], default="none")
    p.add_argument("--cpu-offload", action="store_true",
                   help="FSDP2 CPUOffloadPolicy: shards and AdamW state in host memory, AdamW on the CPU")
    p.add_argument("--offload-activations", action="store_true",
                   help="with --ac full: checkpointed block inputs in pinned host memory (save_on_cpu)")
    p.add_argument("--shape", choices=["1b", "8b", "405b", "qwen3-1.7b", "gemma3-1b", "tiny"], default="1b",
                   help="Llama 3.2 1B (tied), Llama 3.1 8B or 405B (untied) dimensions (405b: with --layers, "
                        "built on the meta device and initialised shard by shard); Qwen3 1.7B or Gemma 3 1B "
                        "(their published config.json, as shardtrain's model.preset); tiny for --device cpu checks")
    p.add_argument("--tp", type=int, default=1, help="GPUs per tensor-parallel group (torchtitan's 2-D plan)")
    p.add_argument("--replicate", type=int, default=1,
                   help="HSDP: fully_shard on a (replicate, shard) mesh of this many replicas (torchtitan's "
                        "data_parallel_replicate_degree); the world size is DDP")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    a = p.parse_args()
    if a.offload_activations and a.ac != "full":
        p.error("--offload-activations offloads checkpointed block inputs: it needs --ac full")

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    if world % a.tp:
        p.error(f"--tp {a.tp} must divide the {world} ranks")
    if world % a.replicate or (a.replicate > 1 and a.tp > 1):
        p.error(f"--replicate {a.replicate} must divide the {world} ranks, without --tp")
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        # CPU offload keeps the gradients in host memory, where the grad norm's reduction needs gloo
        backend = "cpu:gloo,cuda:nccl" if a.cpu_offload else "nccl"
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    dims = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, tie_word_embeddings=True) if a.shape == "1b" else \
        dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, tie_word_embeddings=False) if a.shape == "8b" else \
        dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
             num_key_value_heads=8, tie_word_embeddings=False) if a.shape == "405b" else \
        dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, tie_word_embeddings=True)
    if a.shape in PUBLISHED:  # read as a download's config.json is
        published = dict(PUBLISHED[a.shape])
        if a.layers:
            published["num_hidden_layers"] = a.layers
        cfg = transformers.AutoConfig.for_model(**published)
    else:
        if a.layers:
            dims["num_hidden_layers"] = a.layers
        cfg = transformers.LlamaConfig(vocab_size=128256 if a.shape != "tiny" else 1024, max_position_embeddings=a.seq,
                                       rope_theta=500000.0, rms_norm_eps=1e-5, **dims)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False  # training: no KV cache (its per-layer state also makes torch.compile recompile)
    # the 405B's width does not fit a GPU (or a host) whole: built on the meta device, sharded,
    # then made and initialised shard by shard, as torchtitan does
    meta = a.shape == "405b"
    with torch.device("meta") if meta else dev:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    dp_mesh = None
    if a.tp > 1:
        dp_mesh = parallelize_2d(model, a.tp, world, a.device)
        model.forward = forward_2d(model)
    elif a.replicate > 1:
        from torch.distributed.device_mesh import init_device_mesh
        dp_mesh = init_device_mesh(a.device, (a.replicate, world // a.replicate),
                                   mesh_dim_names=("replicate", "shard"))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else torch.float32, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True) if a.cpu_offload else OffloadPolicy()
    for i, layer in enumerate(model.model.layers):
        if a.ac == "full" and a.offload_activations:
            layer.forward = offloaded_checkpoint(layer.forward)
        elif a.ac == "full":
            fwd = layer.forward
            layer.forward = (lambda f: lambda *x, **k: checkpoint(f, *x, use_reentrant=False, **k))(fwd)
        if a.compile:
            layer.compile()
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=i < len(model.model.layers) - 1,
                    offload_policy=offload)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
    if meta:
        model.to_empty(device="cpu" if a.cpu_offload else dev)
        with torch.no_grad():
            for pname, param in model.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                if pname.endswith("norm.weight"):
                    local.fill_(1.0)
                else:
                    local.normal_(0.0, cfg.initializer_range)
        # rope's frequencies are a buffer that to_empty left uninitialised: made anew on the GPU
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)

    n_params = sum(p.numel() for p in model.parameters())  # DTensor numel: the whole parameter
    # N without the input embedding; the tied head shares that matrix and counts once
    non_embed = n_params if cfg.tie_word_embeddings else n_params - cfg.vocab_size * cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # attention as shardtrain counts it: 12·H·Q·T per causal layer, a sliding layer's share of the
    # causal (query, key) pairs that its window keeps
    T, window = a.seq, getattr(cfg, "sliding_window", None) or 0
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    def pairs(w):
        return T * (T + 1) / 2 if w <= 0 or T <= w else w * (w + 1) / 2 + (T - w) * w
    attention = sum(pairs(window if t == "sliding_attention" else 0) / (T * (T + 1) / 2) for t in types)
    flops_per_token = 6 * non_embed + 12 * attention * head_dim * cfg.num_attention_heads * a.seq
    name = torch.cuda.get_device_name(local) if cuda else "cpu"
    peak = 756e12 if ("H100" in name and "PCIe" in name) else 989e12 if ("H100" in name or "H200" in name) else 0
    say = print if rank == 0 else (lambda *x, **k: None)
    say(f"# {name} x {world}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{n_params} parameters")

    dp_rank = rank // a.tp  # a tensor-parallel group shares its batch
    g = torch.Generator(device=dev).manual_seed(7 + dp_rank)
    board = Board(local) if cuda else Board(-1)
    if a.warmup == 0:
        board.start()
    timed = 0.0
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in range(1, a.warmup + a.steps + 1):
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev, generator=g)
        labels = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev, generator=g)
        sync()
        t0 = time.perf_counter()
        if a.tp > 1:
            loss = step_2d(model, ids, labels)
        else:
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        value = loss.item()
        assert math.isfinite(value), f"loss {value} at step {step}"
        if step == 1:
            # random logits start near ln V + spread^2/2, the spread 0.02 x sqrt(width): up to ~1
            # above ln V for the 8B shape, ~3.4 for the 405B's
            spread2 = cfg.initializer_range ** 2 * cfg.hidden_size
            assert -0.5 < value - math.log(cfg.vocab_size) < 1.0 + spread2 / 2, f"first loss {value} not near ln V"
        if step > a.warmup:
            timed += dt
        if step == a.warmup:
            board.start()  # the timed steps only
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        say(f"# step {step} loss {value:.4f}  grad norm {norm.item():.4f}  {1e3 * dt:.1f} ms")
    tokens = a.batch * a.seq * a.steps / a.tp  # per GPU: a tensor-parallel group shares its batch
    power = board.finish(tokens)
    tps = tokens / timed
    mfu = flops_per_token * tps / peak if peak else 0.0
    peak_mem = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0], device=dev)
    dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
    peak_gib = peak_mem.item()
    label = "HF + FSDP2" + (f" x TP{a.tp} (torchtitan's plan)" if a.tp > 1 else "") \
        + (f" HSDP ({a.replicate} replicas)" if a.replicate > 1 else "") \
        + (" + compile" if a.compile else " eager") + (", CPU offload" if a.cpu_offload else "") \
        + (", activations offloaded" if a.offload_activations else "")
    say(f"| {label} | {a.ac} | {a.batch} | {tps:.0f} | {100 * mfu:.1f} % | {peak_gib:.1f} | |")
    if power:
        say(f"# GPU{' of rank 0' if world > 1 else ''} over the timed steps: {power['gpu_power_w']:.0f} W, "
            f"SM {power['gpu_sm_mhz']} MHz, power-capped {100 * power['gpu_power_capped']:.0f} %; "
            f"{power['mj_per_token']:.2f} mJ per token")
    say(json.dumps(dict(engine=label, shape=a.shape, gpus=world, tp=a.tp, replicate=a.replicate, ac=a.ac, batch=a.batch, seq=a.seq,
                        tokens_per_s_per_gpu=round(tps, 1), mfu=round(mfu, 4), peak_gib=round(peak_gib, 2),
                        **power)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
