#!/usr/bin/env python3
"""The PyTorch peer of bench/train/train_bench.cpp: HF transformers LlamaForCausalLM (sdpa
attention) wrapped with FSDP2 `fully_shard` (per block, then the root), bf16 parameters
with f32 gradient reduction, fused AdamW, optional torch.compile per block and full
activation checkpointing per block. Same shape, batch, random tokens and step count as
train_bench; prints the same table row and JSON line (tokens/s and MFU per GPU).
One rank by default; under torchrun, one rank per GPU (--batch is per rank).

  python3 bench/train/peer_fsdp2.py [--batch 4] [--seq 4096] [--steps 10] [--warmup 3]
                                    [--compile] [--ac none|full] [--shape 1b|8b]
  torchrun --nproc-per-node 2 bench/train/peer_fsdp2.py --shape 8b --batch 1 ...
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--ac", choices=["none", "full"], default="none")
    p.add_argument("--shape", choices=["1b", "8b"], default="1b",
                   help="Llama 3.2 1B (tied) or Llama 3.1 8B (untied) dimensions")
    p.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    a = p.parse_args()

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local))
    torch.manual_seed(0)
    dims = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, tie_word_embeddings=True) if a.shape == "1b" else \
        dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, tie_word_embeddings=False)
    if a.layers:
        dims["num_hidden_layers"] = a.layers
    cfg = transformers.LlamaConfig(vocab_size=128256, max_position_embeddings=a.seq, rope_theta=500000.0,
                                   rms_norm_eps=1e-5, **dims)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, layer in enumerate(model.model.layers):
        if a.ac == "full":
            fwd = layer.forward
            layer.forward = (lambda f: lambda *x, **k: checkpoint(f, *x, use_reentrant=False, **k))(fwd)
        if a.compile:
            layer.compile()
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(model.model.layers) - 1)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    n_params = sum(p.numel() for p in model.parameters())
    # N without the input embedding; the tied head shares that matrix and counts once
    non_embed = n_params if cfg.tie_word_embeddings else n_params - cfg.vocab_size * cfg.hidden_size
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    flops_per_token = 6 * non_embed + 12 * cfg.num_hidden_layers * head_dim * cfg.num_attention_heads * a.seq
    name = torch.cuda.get_device_name(local)
    peak = 756e12 if ("H100" in name and "PCIe" in name) else 989e12 if ("H100" in name or "H200" in name) else 0
    say = print if rank == 0 else (lambda *x, **k: None)
    say(f"# {name} x {world}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{n_params} parameters")

    g = torch.Generator(device="cuda").manual_seed(7 + rank)
    timed = 0.0
    torch.cuda.reset_peak_memory_stats()
    for step in range(1, a.warmup + a.steps + 1):
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda", generator=g)
        labels = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        value = loss.item()
        assert math.isfinite(value), f"loss {value} at step {step}"
        if step == 1:
            # random logits start near ln V + spread^2/2: up to ~1 above ln V for the 8B shape
            assert -0.5 < value - math.log(cfg.vocab_size) < 1.5, f"first loss {value} not near ln V"
        if step > a.warmup:
            timed += dt
        say(f"# step {step} loss {value:.4f}  {1e3 * dt:.1f} ms")
    tps = a.batch * a.seq * a.steps / timed
    mfu = flops_per_token * tps / peak if peak else 0.0
    peak_mem = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
    dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
    peak_gib = peak_mem.item()
    label = "HF + FSDP2" + (" + compile" if a.compile else " eager")
    say(f"| {label} | {a.ac} | {a.batch} | {tps:.0f} | {100 * mfu:.1f} % | {peak_gib:.1f} | |")
    say(json.dumps(dict(engine=label, shape=a.shape, gpus=world, ac=a.ac, batch=a.batch, seq=a.seq,
                        tokens_per_s_per_gpu=round(tps, 1), mfu=round(mfu, 4), peak_gib=round(peak_gib, 2))))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
