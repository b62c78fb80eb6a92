#!/usr/bin/env python3
"""What a training step would take if every lever left were at its bound at once.

Reads the output of a profiled benchmark run (`SHARDTRAIN_PROFILE=1 shardtrain bench ...`:
its per-op table and its summary) and projects the step with each op left as fast as the
best known way to do it:

  attention forward / backward  the given gains over the engine's attention (default: the
                                 FlashAttention-3 paper's head-dim-64, 4k-token figures against
                                 cuDNN on an H100 SXM5: 476 / 408 forward, 453 / 417 backward)
  RoPE                           no pass at all (applied as the attention loads q and k)
  the head's softmax pass        none: the fused head and loss's FLOPs at the step's mean GEMM
                                 rate (the TFLOP/s of linear_forward, linear_forward_add and
                                 linear_backward together)
  GEMM algorithms                every product faster by --gemm-gain (default 0.5 %, what
                                 training.gemm_selection = "timed" measured)
  AdamW, RMSNorm                 at --copy-gbs where slower (default 2,887 GB/s, the TMA copy of
                                 bench/experiments/stream_energy_bench on an H100)
  grad-norm sums                 folded away

Each gain is an upper bound: it assumes the whole gain shows in the step. The per-op table is
synchronised per op; the projection subtracts the savings from --step-ms (a run of the same
job without the profile, e.g. the CUDA-graph step) or else from the profiled run's own step.

  python3 bench/train/lever_bounds.py PROFILE_LOG [--step-ms MS] [--fwd-gain G] [--bwd-gain G]
                                      [--gemm-gain G] [--copy-gbs GBS]
  PROFILE_LOG: a file, or - for standard input.
"""
import argparse
import re
import sys

GEMMS = ("linear_forward", "linear_forward_add", "linear_backward")


def parse(text):
    """The per-op rows {op: (ms, tflops, gbs)}, the timed steps, tokens and ms per step."""
    ops = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*([a-z_0-9]+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*[\d.]+ %\s*\|\s*([\d.]+)\s*\|\s*(\d+)\s*\|",
                     line)
        if m:
            ops[m.group(1)] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
    tokens = re.search(r"batch\s+(\d+) tokens per step", text)
    thr = re.search(r"throughput\s+\d+ tokens/s, ([\d.]+) ms per step \(mean of (\d+) steps", text)
    if not ops or tokens is None or thr is None:
        sys.exit("lever_bounds: expected a per-op table and a bench summary (`batch ... tokens per step`, "
                 "`throughput ... ms per step (mean of N steps`) in the profile log; found "
                 f"{len(ops)} op rows, batch line {'found' if tokens else 'missing'}, throughput line "
                 f"{'found' if thr else 'missing'}")
    return ops, int(thr.group(2)), int(tokens.group(1)), float(thr.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--fwd-gain", type=float, default=476 / 408)
    ap.add_argument("--bwd-gain", type=float, default=453 / 417)
    ap.add_argument("--gemm-gain", type=float, default=0.005)
    ap.add_argument("--copy-gbs", type=float, default=2887.0)
    a = ap.parse_args()
    text = sys.stdin.read() if a.log == "-" else open(a.log).read()
    ops, steps, tokens, profiled_ms = parse(text)

    def ms(op):  # per step
        return ops[op][0] / steps if op in ops else 0.0

    gemm_ms = sum(ms(o) for o in GEMMS)
    gemm_flops = sum(ops[o][0] * ops[o][1] for o in GEMMS if o in ops)  # ms x TFLOP/s
    gemm_rate = gemm_flops / (gemm_ms * steps) if gemm_ms > 0 else 0.0
    head_ms = ms("linear_cross_entropy")
    head_rate = ops["linear_cross_entropy"][1] if "linear_cross_entropy" in ops else 0.0

    def at_copy(op):
        gbs = ops[op][2] if op in ops else 0.0
        return ms(op) * (1 - gbs / a.copy_gbs) if gbs and gbs < a.copy_gbs else 0.0

    levers = [
        ("attention forward", f"x{a.fwd_gain:.3f}", ms("attention_forward") * (1 - 1 / a.fwd_gain)),
        ("attention backward", f"x{a.bwd_gain:.3f}", ms("attention_backward") * (1 - 1 / a.bwd_gain)),
        ("RoPE", "no pass", ms("rope_forward") + ms("rope_backward")),
        ("head's softmax pass", f"its FLOPs at {gemm_rate:.0f} TFLOP/s",
         head_ms * (1 - head_rate / gemm_rate) if gemm_rate > head_rate else 0.0),
        ("GEMM algorithms", f"+{100 * a.gemm_gain:.1f} %", gemm_ms * a.gemm_gain),
        ("AdamW, RMSNorm, grad-norm sums", f"{a.copy_gbs:.0f} GB/s; sums gone",
         at_copy("adamw_step_multi") + at_copy("rmsnorm_forward") + at_copy("rmsnorm_backward") + ms("sum_squares")),
    ]
    step = a.step_ms if a.step_ms > 0 else profiled_ms
    print(f"{tokens} tokens per step; per-op table over {steps} steps ({sum(v[0] for v in ops.values()) / steps:.1f} "
          f"ms per step synchronised); step {step:.1f} ms "
          f"({'given' if a.step_ms > 0 else 'the profiled run'}): {tokens / step * 1e3:,.0f} tokens/s")
    print("| lever | its bound | ms per step saved |")
    print("|---|---|---|")
    for name, bound, saved in levers:
        print(f"| {name} | {bound} | -{saved:.1f} |")
    total = sum(v[2] for v in levers)
    print(f"| all of them | | -{total:.1f} |")
    print(f"projected step {step - total:.1f} ms: {tokens / (step - total) * 1e3:,.0f} tokens/s "
          f"(x{step / (step - total):.3f})")


if __name__ == "__main__":
    main()
