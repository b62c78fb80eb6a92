#!/usr/bin/env python3
"""Loss curves of the FP8 recipes against bf16: the same model, initial weights and batches of real
text, trained once per `training.fp8` setting, then one plot and a table of held-out losses.

  fp8_curves.py data --out FILE TEXT...    # real text as blank-line separated documents (below)
  fp8_curves.py run  --shardtrain BIN --data FILE --out DIR [--steps 2000] [--recipes off,tensorwise,...]
                     [--tokenizer FOLDER] [--batch 8]
  fp8_curves.py plot --out DIR [--png FILE] [--markdown FILE] [--title TEXT]

A recipe is a `training.fp8` value, or one with `+head` (`tensorwise+head`): the head's products in
FP8 too (`training.fp8_head`), and/or `+attention` (`off+attention`, `tensorwise+attention`): the
attention forward's products in FP8 (`training.fp8_attention`). `--tokenizer` trains on a tokenizer's tokens instead of bytes (a
folder with tokenizer.json, e.g. Llama 3's: the head then has its 128,256 rows).

`run` trains each recipe in turn with `shardtrain train` (each run's metrics in DIR/<recipe>.jsonl,
its log in DIR/<recipe>.log, `+` written `-`); `plot` reads them, draws the training loss (smoothed) and the held-out
loss of every recipe in one PNG, and prints each recipe's last held-out loss with its gap to bf16's.
A recipe passes when its last held-out loss is within 0.5 % of bf16's.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# The model: the Llama 3.2 1B width (dim 2048, 32 query and 8 key/value heads, FFN 8192) with 4
# blocks, on bytes of real text (the byte tokenizer: every parameter outside the embedding and the
# head sits in a block linear, the products FP8 changes), 8 sequences of 512 tokens a step.
JOB = [
    "--model.dim=2048", "--model.n_layers=4", "--model.n_heads=32", "--model.n_kv_heads=8",
    "--model.ffn_dim=8192", "--model.max_seq_len=512", "--model.rope_theta=500000",
    "--data.val_fraction=0.02", "--training.seq_len=512", "--training.seed=1234",
    "--optimizer.lr=6e-4", "--optimizer.weight_decay=0.1", "--schedule.type=cosine",
    "--schedule.warmup_steps=100", "--schedule.min_lr_ratio=0.1",
    "--eval.interval_steps=100", "--eval.batches=16", "--eval.at_start=true",
    "--sample.tokens=0", "--logging.interval_steps=50", "--logging.progress=off",
    "--checkpoint.interval_steps=0", "--export.folder=",
]
RECIPES = ["off", "tensorwise", "rowwise", "blockwise"]
ORDER = RECIPES + [r + "+head" for r in RECIPES[1:]] + ["off+attention", "tensorwise+attention"]  # the plot's order
PASS_GAP = 0.005  # a recipe passes within 0.5 % of bf16's last held-out loss


def stem(recipe):
    """A recipe's file names: `tensorwise+head` -> `tensorwise-head`."""
    return recipe.replace("+", "-")


def data(a):
    """Writes the texts as documents of about 4 KiB (blank-line separated; data.val_fraction holds out
    whole documents): a fortune file's `%` lines and blank lines end a paragraph, and paragraphs are
    packed into documents in order."""
    paragraphs = []
    for path in a.texts:
        with open(path, encoding="utf-8", errors="replace") as f:
            para = []
            for line in f:
                line = line.rstrip("\n")
                if line.strip() in ("", "%"):
                    if para:
                        paragraphs.append("\n".join(para))
                    para = []
                else:
                    para.append(line)
            if para:
                paragraphs.append("\n".join(para))
    docs, doc = [], []
    size = 0
    for p in paragraphs:
        doc.append(p)
        size += len(p)
        if size >= 4096:
            docs.append("\n".join(doc))
            doc, size = [], 0
    if doc:
        docs.append("\n".join(doc))
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    print(f"{a.out}: {len(docs)} documents, {sum(len(d) for d in docs):,} characters")


def run(a):
    os.makedirs(a.out, exist_ok=True)
    for recipe in a.recipes.split(","):
        metrics = os.path.join(a.out, f"{stem(recipe)}.jsonl")
        fp8, options = recipe.split("+")[0], recipe.split("+")[1:]
        unknown = set(options) - {"head", "attention"}
        if unknown:
            sys.exit(f"fp8_curves: `{recipe}`: unknown option(s) {', '.join(sorted(unknown))}; use +head, +attention")
        flag = lambda on: "true" if on else "false"
        cmd = [a.shardtrain, "train", *JOB, f"--data.source={a.data}", f"--training.steps={a.steps}",
               f"--data.tokenizer={a.tokenizer}", f"--training.batch_size={a.batch}",
               f"--training.fp8={fp8}", f"--training.fp8_head={flag('head' in options)}",
               f"--training.fp8_attention={flag('attention' in options)}",
               f"--logging.metrics_file={metrics}",
               f"--run.output_dir={os.path.join(a.out, 'run-' + stem(recipe))}", *a.extra]
        t0 = time.time()
        with open(os.path.join(a.out, f"{stem(recipe)}.log"), "w") as log:
            status = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"{recipe}: exit {status} after {time.time() - t0:.0f} s", flush=True)
        if status != 0:
            sys.exit(f"fp8_curves: the {recipe} run failed; see {a.out}/{stem(recipe)}.log")


def read(path):
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "eval_loss" in r:
                evals.append((r["step"], r["eval_loss"]))
            elif "loss" in r:
                steps.append((r["step"], r["loss"]))
    return steps, evals


def smooth(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def label(recipe):
    """`off` -> bf16, `tensorwise+head` -> FP8 tensorwise + head, `off+attention` -> bf16 + FP8 attention."""
    base = "bf16" if recipe.startswith("off") else "FP8 " + recipe.split("+")[0]
    return base + "".join({"head": " + head", "attention": " + FP8 attention"}[o] for o in recipe.split("+")[1:])


def plot(a):
    curves = {}
    for recipe in ORDER:
        path = os.path.join(a.out, f"{stem(recipe)}.jsonl")
        if os.path.exists(path):
            curves[recipe] = read(path)
    if "off" not in curves:
        sys.exit(f"fp8_curves: no bf16 run (off.jsonl) in {a.out}")
    ref = curves["off"][1][-1][1]
    rows = ["| recipe | steps | last held-out loss | against bf16 | within 0.5 % |", "|---|---|---|---|---|"]
    for recipe, (steps, evals) in curves.items():
        step, loss = evals[-1]
        gap = loss / ref - 1
        rows.append(f"| {'bf16' if recipe == 'off' else recipe} | {step} | {loss:.4f} | {100 * gap:+.2f} % | "
                    f"{'yes' if abs(gap) <= PASS_GAP else 'no'} |")
    table = "\n".join(rows)
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table + "\n")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
        ref_steps = dict(curves["off"][0])
        for recipe, (steps, evals) in curves.items():
            name = label(recipe)
            # the training loss against bf16's at the same step, both averaged over 50 steps
            common = [(s, l, ref_steps[s]) for s, l in steps if s in ref_steps]
            ours, theirs = smooth([l for _, l, _ in common], 50), smooth([r for _, _, r in common], 50)
            left.plot([s for s, _, _ in common], [100 * (o / r - 1) for o, r in zip(ours, theirs)], label=name,
                      linewidth=1.2)
            right.plot([s for s, _ in evals], [l for _, l in evals], marker="o", markersize=3, label=name)
        left.set_title("training loss against bf16's (mean of 50 steps)")
        left.set_ylabel("difference (%)")
        left.set_ylim(-3, 3)
        right.set_title("held-out loss")
        right.set_ylabel(a.ylabel)
        for ax in (left, right):
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend()
        lo = min(l for _, ev in curves.values() for _, l in ev[len(ev) // 2:])
        hi = max(l for _, ev in curves.values() for _, l in ev[len(ev) // 4:])
        right.set_ylim(lo - 0.02 * (hi - lo) - 0.01, hi + 0.05 * (hi - lo))
        fig.suptitle(a.title)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
        print(f"wrote {a.png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("texts", nargs="+")
    r = sub.add_parser("run")
    r.add_argument("--shardtrain", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--recipes", default=",".join(RECIPES))
    r.add_argument("--tokenizer", default="byte", help="byte, or a folder with tokenizer.json")
    r.add_argument("--batch", type=int, default=8, help="sequences of 512 tokens a step")
    r.add_argument("extra", nargs="*", help="more --key=value overrides (after --), e.g. a smaller model for a smoke run")
    p = sub.add_parser("plot")
    p.add_argument("--out", required=True)
    p.add_argument("--png")
    p.add_argument("--markdown")
    p.add_argument("--title", default="shardtrain, FP8 recipes against bf16: the 1B shape's width (dim 2048, FFN "
                   "8192), 4 blocks, bytes of real text, the same init and batches")
    p.add_argument("--ylabel", default="loss (nats per byte)")
    a = ap.parse_args()
    {"data": data, "run": run, "plot": plot}[a.cmd](a)


if __name__ == "__main__":
    main()
