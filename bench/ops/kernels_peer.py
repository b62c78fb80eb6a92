"""PyTorch's ops on the shapes of bench/ops/{linear,cross_entropy,adamw,rmsnorm}_bench: bf16
matmuls, the unfused output projection + cross-entropy (full f32 logits, as HF's loss
computes them), fused AdamW, and RMSNorm forward/backward, timed the same way (events around
each call, the L2 cache flushed before it). Prints rows in those programs' format.

    python3 bench/ops/kernels_peer.py [iterations=20]
"""
import math
import sys

import torch
import torch.nn.functional as F

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


FLUSH = None


def time_ms(fn):
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(64 << 20, device="cuda")  # 256 MiB: evicts the 50 MB L2
    fn()
    fn()
    total = 0.0
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(ITERS):
        FLUSH.fill_(float(i))
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        total += start.elapsed_time(stop)
    return total / ITERS


def gemm(T, I, O):
    x = torch.randn(T, I, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(O, I, device="cuda", dtype=torch.bfloat16) * 0.02
    dy = torch.randn(T, O, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * T * I * O
    fwd = time_ms(lambda: x @ w.t())
    bwd = time_ms(lambda: (dy @ w, dy.t() @ x))
    print(f"| torch matmul {T} x {I} -> {O} | {fwd:.3f} ms, {flops / fwd / 1e9:.0f} TFLOP/s | "
          f"{bwd:.3f} ms, {2 * flops / bwd / 1e9:.0f} TFLOP/s (bf16 dW) |")


def cross_entropy(T, D, V):
    h = (torch.randn(T, D, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    w = (torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    targets = (torch.arange(T, device="cuda") * 104729) % V

    def step():
        logits = (h @ w.t()).float()
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        return loss

    loss = step()
    assert abs(loss.item() - math.log(V)) < 0.5, f"mean loss {loss.item()} not near ln V"
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - before) / 2**30
    ms = time_ms(step)
    print(f"| torch unfused (h @ W^T).float() + F.cross_entropy, fwd + bwd, {T} tokens x {V} vocab, D {D} | "
          f"{ms:.2f} ms, {6.0 * T * D * V / ms / 1e9:.0f} TFLOP/s | {extra:.2f} GiB beyond inputs and gradients |")


def bandwidth(n, T, D):
    src = torch.zeros(1 << 29, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    copy_gbs = 2.0 * 4 * (1 << 29) / copy_ms / 1e6
    print(f"| torch copy_ (read + write) | {copy_gbs:.0f} GB/s | |")
    del src, dst
    p = torch.nn.Parameter(torch.randn(n, device="cuda") * 0.02)
    p.grad = torch.randn(n, device="cuda") * 1e-3
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, fused=True)
    ms = time_ms(opt.step)
    print(f"| torch AdamW fused, {n} f32 elements | {ms:.2f} ms, {28.0 * n / ms / 1e6:.0f} GB/s "
          f"({100 * 28.0 * n / ms / 1e6 / copy_gbs:.0f} % of copy) | |")
    del p, opt
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    wt = (torch.randn(D, device="cuda", dtype=torch.bfloat16) * 0.2).requires_grad_()
    dy = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    f_ms = time_ms(lambda: F.rms_norm(x, (D,), wt, 1e-5))
    y = F.rms_norm(x, (D,), wt, 1e-5)
    b_ms = time_ms(lambda: torch.autograd.grad(y, (x, wt), dy, retain_graph=True))
    print(f"| torch F.rms_norm forward, {T} x {D} bf16 | {f_ms:.3f} ms, {4.0 * T * D / f_ms / 1e6:.0f} GB/s | |")
    print(f"| torch F.rms_norm backward (autograd) | {b_ms:.3f} ms, {6.0 * T * D / b_ms / 1e6:.0f} GB/s "
          f"(dy, x, dx) | |")


def main():
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {ITERS} iterations per timing")
    for shape in [(8192, 8192, 8192), (16384, 2048, 8192), (16384, 8192, 2048), (8192, 4096, 14336),
                  (8192, 4096, 4096)]:
        gemm(*shape)
    cross_entropy(32768, 2048, 128256)
    bandwidth(1235814400, 32768, 4096)


if __name__ == "__main__":
    main()
