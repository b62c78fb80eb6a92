#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (cuDNN and flash back-ends) on the shapes of
bench/ops/attention_bench.cu: causal, bf16, GQA through enable_gqa (no K/V copies), same
FLOP convention (forward 4*B*N*T^2*H/2, backward 2.5x), same table.

Then packed documents on the 1B shape with FlexAttention (torchtitan's document mask: causal
and within one document), compiled, against the FLOPs of each document's own causal half.

  python3 bench/ops/attention_peer.py [iterations=20]
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 4096, 32, 8, 64), (8, 4096, 32, 8, 128), (4, 8192, 32, 8, 128), (2, 16384, 32, 8, 128)]


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for backend, label in [(SDPBackend.CUDNN_ATTENTION, "torch SDPA cuDNN"), (SDPBackend.FLASH_ATTENTION, "torch SDPA flash")]:
        for B, T, N, M, H in SHAPES:
            q = torch.randn(B, N, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(B, M, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(B, M, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            with sdpa_kernel(backend):
                try:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                except RuntimeError as e:
                    print(f"| {label} | B{B} T{T} N{N} M{M} H{H} | not supported: {str(e).splitlines()[0][:60]} | | | |")
                    continue
                grad = torch.randn_like(out)
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), iters)
                bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), iters)
            flops = 4.0 * B * N * T * T * H / 2
            print(f"| {label} | B{B} T{T} N{N} M{M} H{H} | {1e3 * fwd:.3f} ms | {flops / fwd / 1e12:.0f} | "
                  f"{1e3 * bwd:.3f} ms | {2.5 * flops / bwd / 1e12:.0f} |")


def documents(iters):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention)
    B, T, N, M, H = 8, 4096, 32, 8, 64
    for length in (4096, 2048, 1024, 512, 256, 100):
        doc = (torch.arange(T, device="cuda") // length).expand(B, T)

        def mask(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

        block_mask = create_block_mask(mask, B, None, T, T, device="cuda")
        q = torch.randn(B, N, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, M, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, M, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = flex(q, k, v, block_mask=block_mask, enable_gqa=True)
        grad = torch.randn_like(out)
        fwd = timed(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True), iters)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), iters)
        lengths = [min(length, T - t0) for t0 in range(0, T, length)]
        flops = B * sum(4.0 * N * n * n * H / 2 for n in lengths)
        print(f"| torch FlexAttention (compiled) | B{B} T{T} N{N} M{M} H{H}, documents of {length} ({B * len(lengths)}) "
              f"| {1e3 * fwd:.3f} ms | {flops / fwd / 1e12:.0f} | {1e3 * bwd:.3f} ms | {2.5 * flops / bwd / 1e12:.0f} |")


if __name__ == "__main__":
    main()
    documents(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
