#!/usr/bin/env python3
"""Loss curves of shardtrain beside PyTorch (HF transformers + FSDP2) from the same initial weights on
the same token batches, with the per-step difference and the summary figures.

  convergence.py run --job NAME --out DIR [--shardtrain BIN] [--data FILE] [--engines shardtrain,pytorch]
                     [--spread] [--steps N] [--torch-micro K] [--torch-ac] [-- --key=value ...]
  convergence.py pytorch --init HF_FOLDER --batches FILE --out FILE.jsonl [--dtype bf16|f32]
                     [--micro K] [--ac] [--order-seed S] [--time-limit SECONDS]
  convergence.py plot --out DIR [--png FILE] [--title TEXT]
  convergence.py reference --from DIR --to FOLDER       # keep a run's PyTorch curve for `check`
  convergence.py check --out DIR --reference FOLDER     # shardtrain's curve against a kept PyTorch one

`run` does, in DIR:
  1. init/: shardtrain's initialisation of the job's model, exported as an HF folder in f32
     (`shardtrain train --training.steps=0 --export.folder=... --export.dtype=f32`);
  2. batches.safetensors: every token batch and held-out batch of the job (`shardtrain batches`),
     with the learning rate of each step and AdamW's settings;
  3. shardtrain.jsonl: `shardtrain train --model.hf=DIR/init` on those batches;
  4. pytorch.jsonl: HF transformers' LlamaForCausalLM (sdpa attention) from DIR/init, wrapped with
     FSDP2 `fully_shard` per block and at the root (bf16 parameters, f32 gradient reduction on a
     GPU; f32 throughout on the CPU), fused AdamW, torch's gradient clipping, fed the rows of
     batches.safetensors: the loss of a step is the sum over its global batch over the counted
     tokens, as shardtrain's; launched with torchrun when --gpus > 1;
  5. with --spread, pytorch-order2.jsonl: PyTorch again with the steps' batches in another order
     (the same rows and held-out set), the run-to-run noise the difference between engines is
     measured against;
  6. `plot`: curves.png (both curves, and the per-step difference underneath) and summary.md.

Jobs (JOBS below): tiny-cpu (f32 on the CPU, bytes of ../shared/data's Shakespeare, 100 steps: the
CI check against a kept PyTorch curve), 350m (a ~370M Llama 3 shape at seq 2048, 3,000 steps),
1b (the Llama 3.2 1B shape at seq 4096, 500 steps), 350m-sft (fine-tuning the 350m run's export on
prompt/response examples, loss on responses only, packed with document masks). The GPU jobs read
the real-text corpus that bench/train/corpus.py builds, tokenized with Llama 3's tokenizer.

The summary: the largest relative gap of the first 20 steps' losses, the mean loss over the last
100 steps and the final held-out loss of each engine, and their gaps; with --spread, the same gaps
between the two PyTorch runs.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fp8_curves import smooth  # noqa: E402  (the running mean both scripts plot)
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

COMMON = ["--sample.tokens=0", "--logging.interval_steps=1", "--logging.progress=off",
          "--checkpoint.interval_steps=0", "--run.overwrite=true"]
JOBS = {
    "tiny-cpu": dict(
        model=["--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
               "--model.ffn_dim=160", "--model.max_seq_len=64", "--model.rope_theta=10000"],
        train=["--training.device=cpu", "--model.dtype=f32", "--training.seq_len=64", "--training.batch_size=4",
               "--training.steps=100", "--training.seed=1234", "--optimizer.lr=3e-3", "--optimizer.weight_decay=0.1",
               "--schedule.type=cosine", "--schedule.warmup_steps=10", "--data.val_fraction=0.02",
               "--eval.interval_steps=25", "--eval.batches=8", "--eval.at_start=true", "--training.threads=1"],
        data=os.path.join(SHARED, "data", "corpus", "tinyshakespeare.txt"), tokenizer="byte", dtype="f32"),
    "small-f32": dict(  # f32 on a GPU: the engines' GPU paths compared with no bf16 rounding
        model=["--model.dim=256", "--model.n_layers=4", "--model.n_heads=4", "--model.n_kv_heads=2",
               "--model.ffn_dim=704", "--model.max_seq_len=256", "--model.rope_theta=10000",
               "--model.tie_embeddings=true"],
        train=["--model.dtype=f32", "--training.seq_len=256", "--training.batch_size=8", "--training.steps=300",
               "--training.seed=1234", "--optimizer.lr=2e-3", "--optimizer.weight_decay=0.1",
               "--schedule.type=cosine", "--schedule.warmup_steps=20", "--data.val_fraction=0.02",
               "--eval.interval_steps=50", "--eval.batches=8", "--eval.at_start=true"],
        data=os.path.join(SHARED, "data", "corpus", "tinyshakespeare.txt"), tokenizer="byte", dtype="f32",
        device="cuda"),
    "350m": dict(
        model=["--model.dim=1024", "--model.n_layers=20", "--model.n_heads=16", "--model.n_kv_heads=8",
               "--model.ffn_dim=2816", "--model.max_seq_len=2048", "--model.rope_theta=500000",
               "--model.tie_embeddings=true"],
        train=["--training.seq_len=2048", "--training.batch_size=4", "--training.steps=3000", "--training.seed=1234",
               "--optimizer.lr=6e-4", "--optimizer.weight_decay=0.1", "--schedule.type=cosine",
               "--schedule.warmup_steps=150", "--data.val_fraction=0.01", "--eval.interval_steps=250",
               "--eval.batches=16", "--eval.at_start=true", "--training.activation_checkpointing=none"],
        data=None, tokenizer="llama3", dtype="bf16"),
    "1b": dict(
        model=["--model.preset=llama3.2-1b"],
        train=["--training.seq_len=4096", "--training.batch_size=8", "--training.steps=500", "--training.seed=1234",
               "--optimizer.lr=4e-4", "--optimizer.weight_decay=0.1", "--schedule.type=cosine",
               "--schedule.warmup_steps=50", "--data.val_fraction=0.01", "--eval.interval_steps=100",
               "--eval.batches=8", "--eval.at_start=true"],
        data=None, tokenizer="llama3", dtype="bf16"),
    "350m-sft": dict(
        model=[],
        train=["--data.format=sft", "--data.packing=true", "--training.seq_len=2048", "--training.batch_size=8",
               "--training.steps=200", "--training.seed=1234", "--optimizer.lr=1e-4", "--optimizer.weight_decay=0.0",
               "--schedule.type=cosine", "--schedule.warmup_steps=20", "--data.val_fraction=0.02",
               "--eval.interval_steps=25", "--eval.batches=8", "--eval.at_start=true"],
        data=None, tokenizer="llama3", dtype="bf16", finetune=True),
}
FIRST_STEPS = 20  # the steps whose losses are compared one by one

# The PyTorch runs `run` can add (--engines), with their flags to `pytorch` and their labels.
# HF's bf16 model rounds inside three ops that shardtrain's kernels compute in f32 and round
# once: rope (cos and sin rounded to bf16, then q*cos, rotate(q)*sin and their sum each
# rounded), RMSNorm (the normalised x rounded before the weight's product) and SwiGLU (silu(gate)
# rounded before the product with up); and it rounds the attention's and the MLP's output
# projections before adding them to the residual stream, where shardtrain's GEMMs add them in
# f32 and round the sum once. The rope, once and fused variants compute those ops as shardtrain
# does (fused: all of them); compile lets torch.compile fuse them as it chooses.
TORCH_VARIANTS = {
    "pytorch": ([], "PyTorch (HF transformers + FSDP2)"),
    "pytorch-order2": (["--order-seed", "2"], "PyTorch, batches in another order"),
    "pytorch-f32head": (["--head-f32"], "PyTorch, f32 logits"),
    "pytorch-f32rope": (["--rounding", "rope"], "PyTorch, rope in f32"),
    "pytorch-once": (["--rounding", "once"], "PyTorch, rope, RMSNorm and SwiGLU in f32"),
    "pytorch-fused": (["--rounding", "fused"], "PyTorch, as shardtrain rounds"),
    "pytorch-compile": (["--compile"], "PyTorch + torch.compile"),
    # the precision reference for a bf16 job: f32 parameters, activations and gradients (TF32
    # products, whose inputs keep 10 bits of mantissa against bf16's 7), compiled for speed
    "pytorch-f32": (["--dtype", "f32", "--tf32", "--compile"], "PyTorch in f32 (TF32 products)"),
}


def sh(cmd, log=None, env=None, ok=(0,)):
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.time()
    if log:
        with open(log, "w") as f:
            status = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    else:
        status = subprocess.call(cmd, env=env)
    if status not in ok:
        sys.exit(f"convergence: exit {status} from {cmd[0]} {cmd[1] if len(cmd) > 1 else ''}"
                 + (f"; see {log}" if log else ""))
    return time.time() - t0


def tokenizer_path(name):
    if name == "byte":
        return "byte"
    if name == "llama3":
        path = os.path.join(SHARED, "data", "tokenizers", "llama3")
        if not os.path.isdir(path):
            sys.exit(f"convergence: the Llama 3 tokenizer is not at {path}")
        return path
    return name


def run(a):
    job = JOBS[a.job]
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    data = a.data or job["data"]
    if not data or not os.path.exists(data):
        sys.exit(f"convergence: job {a.job} needs --data (its corpus: a token file, text or JSONL), found {data!r}")
    tok = tokenizer_path(a.tokenizer or job["tokenizer"])
    steps = [f"--training.steps={a.steps}"] if a.steps else []
    train = job["train"] + steps + [f"--data.source={data}", f"--data.tokenizer={tok}"] + a.extra
    init = os.path.join(out, "init")
    if job.get("finetune"):
        if not a.init:
            sys.exit("convergence: a fine-tuning job starts from a trained model: give --init HF_FOLDER")
        init = os.path.abspath(a.init)
    elif not os.path.exists(os.path.join(init, "model.safetensors")):
        # the job's initialisation, exported before any step, in f32 (the masters' own values)
        sh([a.shardtrain, "train", *COMMON, *job["model"], *train, "--training.steps=0",
            f"--run.output_dir={os.path.join(out, 'run-init')}", f"--export.folder={init}", "--export.dtype=f32",
            "--eval.enabled=false", "--eval.at_start=false", "--logging.metrics_file="], log=os.path.join(out, "init.log"))
    batches = os.path.join(out, "batches.safetensors")
    job_args = [*COMMON, *train, f"--model.hf={init}"]
    engines = a.engines.split(",") + (["pytorch-order2"] if a.spread else [])
    if not os.path.exists(batches):  # the rows every engine trains on, once
        sh([a.shardtrain, "batches", *job_args, "--out", batches], log=os.path.join(out, "batches.log"))
    if "shardtrain" in engines:
        launch = [a.shardtrain] if a.gpus <= 1 else ["torchrun", "--standalone", f"--nproc_per_node={a.gpus}",
                                                     "--no-python", a.shardtrain]
        seconds = sh([*launch, "train", *job_args, "--export.folder=" + (os.path.join(out, "shardtrain-hf")
                                                                          if a.export else ""),
                      f"--run.output_dir={os.path.join(out, 'run-shardtrain')}",
                      f"--logging.metrics_file={os.path.join(out, 'shardtrain.jsonl')}"],
                     log=os.path.join(out, "shardtrain.log"))
        print(f"shardtrain: {seconds:.0f} s", flush=True)
    for recipe in (a.fp8.split(",") if a.fp8 else []):
        fp8, head = recipe.split("+")[0], recipe.endswith("+head")
        name = "shardtrain-fp8-" + recipe.replace("+", "-")
        seconds = sh([a.shardtrain, "train", *job_args, "--export.folder=", f"--training.fp8={fp8}",
                      f"--training.fp8_head={'true' if head else 'false'}",
                      f"--run.output_dir={os.path.join(out, 'run-' + name)}",
                      f"--logging.metrics_file={os.path.join(out, name + '.jsonl')}"],
                     log=os.path.join(out, name + ".log"))
        print(f"{name}: {seconds:.0f} s", flush=True)
    for name, (flags, _) in TORCH_VARIANTS.items():
        if name not in engines:
            continue
        launch = [sys.executable] if a.gpus <= 1 else ["torchrun", "--standalone", f"--nproc_per_node={a.gpus}"]
        cmd = [*launch, os.path.abspath(__file__), "pytorch", "--init", init, "--batches", batches,
               "--out", os.path.join(out, f"{name}.jsonl"), "--dtype", job["dtype"], "--micro", str(a.torch_micro),
               "--device", job.get("device", "cuda" if job["dtype"] == "bf16" else "cpu")]
        cmd += (["--ac"] if a.torch_ac else []) + flags
        cmd += (["--time-limit", str(a.time_limit)] if a.time_limit else [])
        seconds = sh(cmd, log=os.path.join(out, f"{name}.log"), ok=(0, 75))  # 75: stopped by --time-limit
        print(f"{name}: {seconds:.0f} s", flush=True)
    if "shardtrain" in engines and "pytorch" in engines:  # (a run of one engine leaves the plot to `plot`)
        a.png = os.path.join(out, "curves.png")
        a.title = f"{a.job}: shardtrain and PyTorch (HF transformers + FSDP2), same init and batches"
        plot(a)


# ---------------------------------------------------------------------------------------------
# The PyTorch side


ROUNDED_CALLS = {"rope": 0, "rmsnorm": 0, "swiglu": 0, "residual": 0}  # the patched ops' calls: proof that they ran


def round_once(which):
    """Patches transformers' Llama ops to compute in f32 and round their bf16 output once:
    rope ("rope"); rope, RMSNorm and SwiGLU ("once"); those and the residual adds of the output
    projections ("fused": the projection's f32 sums plus the residual, rounded once). Returns,
    for "fused", the forward the output projections must take."""
    import torch
    import torch.nn.functional as F
    from transformers.models.llama import modeling_llama as ml

    rotary_forward = ml.LlamaRotaryEmbedding.forward
    ml.LlamaRotaryEmbedding.forward = lambda self, x, *args, **kw: rotary_forward(self, x.float(), *args, **kw)
    apply = ml.apply_rotary_pos_emb

    def apply_once(q, k, cos, sin, *args, **kw):
        ROUNDED_CALLS["rope"] += 1
        qe, ke = apply(q.float(), k.float(), cos.float(), sin.float(), *args, **kw)
        return qe.to(q.dtype), ke.to(k.dtype)
    ml.apply_rotary_pos_emb = apply_once
    if which == "rope":
        return None

    def norm_once(self, x):
        ROUNDED_CALLS["rmsnorm"] += 1
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * h).to(x.dtype)
    ml.LlamaRMSNorm.forward = norm_once

    def mlp_once(self, x):
        ROUNDED_CALLS["swiglu"] += 1
        h = (F.silu(self.gate_proj(x).float()) * self.up_proj(x).float()).to(x.dtype)
        return self.down_proj(h)
    ml.LlamaMLP.forward = mlp_once
    if which != "fused":
        return None

    # The output projections in f32 from bf16 operands: TF32 holds a bf16 value exactly, so these
    # products are the bf16 GEMM's with its f32 sums, not rounded before the residual add.
    torch.backends.cuda.matmul.allow_tf32 = True

    def f32_out(self, x):
        return F.linear(x.float(), self.weight.float())

    def layer_fused(self, hidden_states, **kw):
        ROUNDED_CALLS["residual"] += 1
        residual = hidden_states
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kw)
        hidden_states = (residual.float() + h).to(residual.dtype)
        residual = hidden_states
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        return (residual.float() + h).to(residual.dtype)
    ml.LlamaDecoderLayer.forward = layer_fused
    return f32_out


def pytorch(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from safetensors import safe_open
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cuda = torch.cuda.is_available() and a.device == "cuda"
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    torch.set_num_threads(a.threads or torch.get_num_threads())

    f = safe_open(a.batches, framework="pt")
    recipe = json.loads(f.metadata()["recipe"])
    lrs = f.get_tensor("lr").tolist()
    S, A, G, T = f.get_slice("train.ids").get_shape()
    assert G % world == 0, f"{G} sequences a step do not split over {world} ranks"
    rows = slice(rank * G // world, (rank + 1) * G // world)
    ignore = recipe["ignore_index"]
    eval_steps = set(recipe["eval_steps"])
    has_positions = recipe["document_mask"]

    f32_out = round_once(a.rounding) if a.rounding != "hf" else None
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (world,))
    try:  # transformers 5 calls it dtype, 4 torch_dtype
        model = transformers.LlamaForCausalLM.from_pretrained(a.init, dtype=torch.float32, attn_implementation="sdpa")
    except TypeError:
        model = transformers.LlamaForCausalLM.from_pretrained(a.init, torch_dtype=torch.float32,
                                                              attn_implementation="sdpa")
    model = model.to(device)
    model.config.use_cache = False
    if f32_out is not None:  # the output projections' products in f32 (fused rounding)
        import types
        for layer in model.model.layers:
            layer.self_attn.o_proj.forward = types.MethodType(f32_out, layer.self_attn.o_proj)
            layer.mlp.down_proj.forward = types.MethodType(f32_out, layer.mlp.down_proj)
    bf16 = a.dtype == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    # --head-f32: the root's parameters (embedding, final norm, head) stay f32, so the logits are f32 (TF32
    # products) as shardtrain's are, where FSDP2's bf16 policy rounds them to bf16 before the loss
    root_mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32) if a.head_f32 else mp
    if a.head_f32 and cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    if a.ac:  # each block's activations recomputed in the backward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.compile:  # each block compiled before it is sharded, as torchtitan does
        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = torch.compile(layer)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=root_mp)
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2 or recipe["decay_1d"]]
    rest = [p for _, p in model.named_parameters() if not (p.ndim >= 2 or recipe["decay_1d"])]
    groups = [{"params": decay, "weight_decay": recipe["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lrs[0], betas=(recipe["beta1"], recipe["beta2"]), eps=recipe["eps"],
                            fused=cuda, foreach=not cuda)

    order = list(range(S))
    if a.order_seed:
        import random
        random.Random(a.order_seed).shuffle(order)

    def document_mask(pos):
        # [B, 1, T, T]: a token sees the tokens of its own document (from its position-0 token) up to itself
        doc = torch.cumsum((pos == 0).int(), dim=1)
        causal = torch.ones(T, T, dtype=torch.bool, device=pos.device).tril()
        return (doc[:, :, None] == doc[:, None, :]) & causal

    def loss_sum(ids, targets, pos):
        kw = {}
        if pos is not None:
            kw = dict(position_ids=pos, attention_mask=document_mask(pos)[:, None])
        logits = model(input_ids=ids, **kw).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=ignore, reduction="sum")

    def rows_of(name, index):
        t = f.get_slice(name)[index]
        return t

    def evaluate():
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=device)
        E = f.get_slice("eval.ids").get_shape()[0]
        with torch.no_grad():
            for i in range(E):
                ids = f.get_slice("eval.ids")[i][rows].to(device).long()
                tg = f.get_slice("eval.targets")[i][rows].to(device).long()
                pos = f.get_slice("eval.positions")[i][rows].to(device).long() if has_positions else None
                for c in range(0, ids.shape[0], a.micro):
                    total[0] += loss_sum(ids[c:c + a.micro], tg[c:c + a.micro],
                                         None if pos is None else pos[c:c + a.micro]).double()
                total[1] += (tg != ignore).sum()
        dist.all_reduce(total)
        model.train()
        return (total[0] / total[1]).item()

    state_file = a.out + ".state.pt"
    first = 0
    log = open(a.out, "a" if os.path.exists(state_file) else "w") if rank == 0 else None
    if os.path.exists(state_file):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        saved = torch.load(state_file, weights_only=False)
        set_state_dict(model, opt, model_state_dict=saved["model"], optim_state_dict=saved["optim"],
                       options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
        first = saved["step"]
        print(f"pytorch: resumed after step {first}", flush=True)
    start = time.time()
    if first == 0 and 0 in eval_steps:
        e = evaluate()
        if log:
            log.write(json.dumps({"step": 0, "eval_loss": e}) + "\n")
    for s in range(first, S):
        t0 = time.time()
        k = order[s]
        ids_all = rows_of("train.ids", k)  # [A, G, T]
        tg_all = rows_of("train.targets", k)
        pos_all = rows_of("train.positions", k) if has_positions else None
        counted = float((tg_all != ignore).sum())  # over the global batch: every rank reads all of it
        total = torch.zeros(1, dtype=torch.float64, device=device)
        for m in range(A):
            ids = ids_all[m][rows].to(device).long()
            tg = tg_all[m][rows].to(device).long()
            pos = pos_all[m][rows].to(device).long() if pos_all is not None else None
            for c in range(0, ids.shape[0], a.micro):
                l = loss_sum(ids[c:c + a.micro], tg[c:c + a.micro], None if pos is None else pos[c:c + a.micro])
                # FSDP2 averages the ranks' gradients (it divides their sum by the world size);
                # the step's gradient is their sum over the counted tokens, so each rank's loss
                # is scaled up by the world size
                (l * world / counted).backward()
                total += l.detach().double()
        dist.all_reduce(total)
        max_norm = recipe["max_grad_norm"] if recipe["max_grad_norm"] > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        for g in opt.param_groups:
            g["lr"] = lrs[s]
        opt.step()
        opt.zero_grad(set_to_none=True)
        step = s + 1
        if step == 1 and a.rounding != "hf":
            print(f"pytorch: rounded-once ops called in the first step: {ROUNDED_CALLS}", flush=True)
            assert ROUNDED_CALLS["rope"] > 0 and (a.rounding == "rope" or ROUNDED_CALLS["swiglu"] > 0)
            assert a.rounding != "fused" or ROUNDED_CALLS["residual"] > 0
        if log:
            log.write(json.dumps({"step": step, "loss": total.item() / counted, "grad_norm": float(norm),
                                  "lr": lrs[s], "seconds": time.time() - t0}) + "\n")
            if step % 50 == 0 or step in (1, 10) or step == S:
                log.flush()
                peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
                print(f"pytorch: step {step}/{S} loss {total.item() / counted:.4f} "
                      f"({(time.time() - start) / (step - first):.3f} s/step, peak {peak:.1f} GiB)", flush=True)
        if step in eval_steps:
            e = evaluate()
            if log:
                log.write(json.dumps({"step": step, "eval_loss": e}) + "\n")
                log.flush()
        if a.time_limit and time.time() - start > a.time_limit and step < S:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:
                torch.save({"model": msd, "optim": osd, "step": step}, state_file + ".tmp")
                os.replace(state_file + ".tmp", state_file)
                print(f"pytorch: stopped after step {step} by --time-limit; run again to go on", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            sys.exit(75)
    if rank == 0 and os.path.exists(state_file):
        os.remove(state_file)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Curves, summary, the kept reference


def read(path):
    steps, evals = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "eval_loss" in r:
                evals[r["step"]] = r["eval_loss"]
            elif "loss" in r:
                steps[r["step"]] = r["loss"]
    return steps, evals


def gaps(ours, theirs):
    """The figures of one curve against another: the first steps' largest relative gap, the mean of
    the last 100 steps, the final held-out loss."""
    (s1, e1), (s2, e2) = ours, theirs
    common = sorted(set(s1) & set(s2))
    first = common[:FIRST_STEPS]
    last = common[-100:]
    m1 = sum(s1[s] for s in last) / len(last)
    m2 = sum(s2[s] for s in last) / len(last)
    ev = sorted(set(e1) & set(e2))
    return {
        "steps": len(common),
        "first_max_rel": max(abs(s1[s] / s2[s] - 1) for s in first),
        "last100": (m1, m2, m1 / m2 - 1),
        "final_eval": (ev[-1], e1[ev[-1]], e2[ev[-1]], e1[ev[-1]] / e2[ev[-1]] - 1) if ev else None,
    }


def comparison_rows(label, n, columns):
    """Summary rows of one curve against another (gaps()): its mean of the last 100 steps and its last
    held-out loss, the values in the shardtrain column, the PyTorch column (`columns` names where the
    first curve's value goes), or both."""
    def cells(ours, theirs):
        return {"both": f"{ours:.4f} | {theirs:.4f}", "shardtrain": f"{ours:.4f} | ", "pytorch": f" | {ours:.4f}"}[columns]
    m1, m2, gap = n["last100"]
    rows = [f"| {label}: mean of the last 100 steps | {cells(m1, m2)} | {100 * gap:+.3f} % |"]
    if n["final_eval"]:
        step, e1, e2, gap = n["final_eval"]
        rows.append(f"| {label}: held-out loss at step {step} | {cells(e1, e2)} | {100 * gap:+.3f} % |")
    return rows


def plot(a):
    curves = {}
    fp8 = sorted(f[:-6] for f in os.listdir(a.out) if f.startswith("shardtrain-fp8-") and f.endswith(".jsonl"))
    for name in ("shardtrain", *TORCH_VARIANTS, *fp8):
        path = os.path.join(a.out, f"{name}.jsonl")
        if os.path.exists(path):
            curves[name] = read(path)
    ref = a.reference
    for need in ("shardtrain", ref):
        if need not in curves:
            sys.exit(f"convergence: no {need}.jsonl in {a.out}")
    g = gaps(curves["shardtrain"], curves[ref])
    lines = [f"| figure | shardtrain | PyTorch | gap |", "|---|---|---|---|",
             f"| steps | {g['steps']} | {g['steps']} | |",
             f"| largest gap of the first {FIRST_STEPS} steps' losses | | | {g['first_max_rel']:.2e} |",
             f"| mean loss, last 100 steps | {g['last100'][0]:.4f} | {g['last100'][1]:.4f} | "
             f"{100 * g['last100'][2]:+.3f} % |"]
    if g["final_eval"]:
        st, e1, e2, gap = g["final_eval"]
        lines.append(f"| held-out loss at step {st} | {e1:.4f} | {e2:.4f} | {100 * gap:+.3f} % |")
    if "pytorch-order2" in curves:
        lines += comparison_rows("PyTorch, batches in another order, against PyTorch",
                                 gaps(curves["pytorch-order2"], curves[ref]), "pytorch")
    for name, what in (("pytorch-f32head", "f32 logits"), ("pytorch-f32rope", "rope in f32"),
                       ("pytorch-once", "rope, RMSNorm and SwiGLU in f32"),
                       ("pytorch-fused", "shardtrain's rounding"), ("pytorch-compile", "torch.compile"),
                       ("pytorch-f32", "f32 (TF32 products), compiled")):
        if name in curves:
            lines += comparison_rows(f"against PyTorch with {what}", gaps(curves["shardtrain"], curves[name]), "both")
    for name in fp8:
        label = "shardtrain, FP8 " + name[len("shardtrain-fp8-"):].replace("-head", " + head")
        lines += comparison_rows(label, gaps(curves[name], curves[ref]), "shardtrain")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(a.out, "summary.md"), "w") as fh:
        fh.write(table + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as fh:
        json.dump({"shardtrain_vs_pytorch": g, **({"spread": gaps(curves["pytorch-order2"], curves[ref])}
                                                  if "pytorch-order2" in curves else {})}, fh, indent=1)
    if not a.png:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    colours = {"shardtrain": "tab:blue", "pytorch": "tab:orange", "pytorch-order2": "tab:gray",
               "pytorch-f32head": "black", "pytorch-f32rope": "tab:cyan", "pytorch-once": "tab:olive",
               "pytorch-fused": "tab:pink", "pytorch-compile": "tab:brown", "pytorch-f32": "black"}
    labels = {"shardtrain": "shardtrain", **{k: v[1] for k, v in TORCH_VARIANTS.items()}}
    for name, colour in zip(fp8, ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "gold")):
        colours[name] = colour
        labels[name] = "shardtrain, FP8 " + name[len("shardtrain-fp8-"):].replace("-head", " + head")
    window = max(1, min(50, g["steps"] // 20))
    for name, (steps, evals) in curves.items():
        main = name in ("shardtrain", ref)
        if main:  # the training loss of the two engines, faint; the held-out loss of every run
            xs = sorted(steps)
            top.plot(xs, smooth([steps[s] for s in xs], window), color=colours[name], linewidth=0.8, alpha=0.45,
                     label=f"{labels[name]}, training loss (mean of {window} steps)")
        ev = sorted(evals)
        top.plot(ev, [evals[s] for s in ev], "o-", color=colours[name], markersize=3.5,
                 linewidth=1.6 if main else 1.0, label=f"{labels[name]}, held-out loss")
    top.set_ylabel("loss (nats per token)")
    ref_xs = sorted(curves[ref][0])
    ref_smooth = smooth([curves[ref][0][x] for x in ref_xs], window)
    late = [v for _, ev in curves.values() for s, v in ev.items() if ev and s >= max(ev) // 4] + \
           [v for x, v in zip(ref_xs, ref_smooth) if x > g["steps"] // 4]
    if late:
        lo, hi = min(late), max(late)
        top.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    top.legend(fontsize=7.5, ncol=2)
    top.grid(alpha=0.3)
    top.set_title(a.title, fontsize=10)
    ref_s = curves[ref][0]
    extent = 0.5
    for name in ("shardtrain", *[k for k in TORCH_VARIANTS if k != "pytorch"], *fp8):
        if name not in curves:
            continue
        s = curves[name][0]
        xs = sorted(set(s) & set(ref_s))
        # means of 50 steps against PyTorch's (a run in another order sees other batches at each step, so
        # only such means compare); shardtrain's per-step difference faint behind its mean
        ours, theirs = smooth([s[x] for x in xs], 50), smooth([ref_s[x] for x in xs], 50)
        diff = [100 * (o / t - 1) for o, t in zip(ours, theirs)]
        if name != "pytorch-order2":  # its swings are the batches', and may leave the frame
            extent = max(extent, max(abs(v) for v in diff[50:] or diff))
        if name == "shardtrain":
            bottom.plot(xs, [100 * (s[x] / ref_s[x] - 1) for x in xs], color=colours[name], linewidth=0.3, alpha=0.3)
        bottom.plot(xs, diff, color=colours[name], linewidth=1.4 if name == "shardtrain" else 1.0,
                    label=f"{labels[name]}")
    bottom.axhline(0, color="black", linewidth=0.6)
    bottom.set_ylim(-1.5 * extent, 1.5 * extent)
    bottom.set_ylabel("training loss against PyTorch's (%),\nmeans of 50 steps")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=7.5, ncol=2)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png}")


def init_checksums(folder):
    """Each tensor's CRC32C as shardtrain's export records it: the same init, read back."""
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return json.loads(header["__metadata__"]["crc32c"]) if "crc32c" in header.get("__metadata__", {}) else None


def batches_sha256(path):
    """SHA-256 of a batches file's tensor bytes (its header names the job's paths, which differ by machine)."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(8 + n)
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def reference(a):
    source = getattr(a, "from")
    os.makedirs(a.to, exist_ok=True)
    shutil.copy(os.path.join(source, "pytorch.jsonl"), os.path.join(a.to, "pytorch.jsonl"))
    manifest = {"init_crc32c": init_checksums(os.path.join(source, "init")),
                "batches_sha256": batches_sha256(os.path.join(source, "batches.safetensors"))}
    with open(os.path.join(a.to, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"kept {a.to}/pytorch.jsonl and manifest.json")


def check(a):
    """shardtrain's curve in --out against the kept PyTorch curve: the same init and batches first, then
    the first steps' losses one by one, then the whole curve."""
    with open(os.path.join(a.reference, "manifest.json")) as f:
        manifest = json.load(f)
    crc = init_checksums(os.path.join(a.out, "init"))
    if crc != manifest["init_crc32c"]:
        sys.exit("convergence check: the initial weights differ from the reference's (their CRC32C per tensor): "
                 "the reference was made from another initialisation; remake it (see this file's docstring)")
    if batches_sha256(os.path.join(a.out, "batches.safetensors")) != manifest["batches_sha256"]:
        sys.exit("convergence check: the batches differ from the reference's; remake it")
    ours = read(os.path.join(a.out, "shardtrain.jsonl"))
    theirs = read(os.path.join(a.reference, "pytorch.jsonl"))
    g = gaps(ours, theirs)
    worst_all = max(abs(ours[0][s] / theirs[0][s] - 1) for s in set(ours[0]) & set(theirs[0]))
    worst_eval = max(abs(ours[1][s] / theirs[1][s] - 1) for s in set(ours[1]) & set(theirs[1]))
    print(f"steps {g['steps']}: the first {FIRST_STEPS} within {g['first_max_rel']:.2e} (limit {a.first_limit:g}); "
          f"every step within {worst_all:.2e} (limit {a.all_limit:g}); held-out losses within {worst_eval:.2e}; "
          f"mean of the last 100 steps {100 * g['last100'][2]:+.4f} %")
    ok = g["steps"] == len(theirs[0]) and g["first_max_rel"] <= a.first_limit and worst_all <= a.all_limit \
        and worst_eval <= a.all_limit
    if not ok:
        sys.exit("convergence check: shardtrain's curve left PyTorch's")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--job", choices=sorted(JOBS), required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--shardtrain", default=os.path.join(ROOT, "build", "shardtrain"))
    r.add_argument("--data", help="the corpus (a token file, text or JSONL); the job's default otherwise")
    r.add_argument("--tokenizer", help="byte, llama3 (../shared's), or a tokenizer.json folder")
    r.add_argument("--init", help="a fine-tuning job's starting model (an HF folder)")
    r.add_argument("--engines", default="shardtrain,pytorch",
                   help="of shardtrain, pytorch, pytorch-order2 (PyTorch, batches in another order), "
                        "pytorch-f32head (PyTorch with f32 logits), pytorch-f32rope (rope in f32), pytorch-once "
                        "(rope, RMSNorm and SwiGLU in f32), pytorch-fused (and the residual adds), pytorch-compile "
                        "(torch.compile per block), pytorch-f32 (f32, TF32 products, compiled); none: only the initial weights and the batches")
    r.add_argument("--spread", action="store_true", help="PyTorch a second time, batches in another order")
    r.add_argument("--steps", type=int, default=0)
    r.add_argument("--fp8", default="", help="shardtrain again with these FP8 recipes (tensorwise,rowwise+head,...)")
    r.add_argument("--gpus", type=int, default=1)
    r.add_argument("--export", action="store_true", help="export shardtrain's trained model to DIR/shardtrain-hf")
    r.add_argument("--torch-micro", type=int, default=2, help="sequences per PyTorch forward (its memory)")
    r.add_argument("--torch-ac", action="store_true", help="checkpoint PyTorch's blocks (its memory)")
    r.add_argument("--time-limit", type=float, default=0, help="PyTorch stops and saves after this many seconds")
    r.add_argument("extra", nargs="*", help="more --key=value overrides for both engines (after --)")
    p = sub.add_parser("pytorch")
    p.add_argument("--init", required=True)
    p.add_argument("--batches", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--ac", action="store_true")
    p.add_argument("--order-seed", type=int, default=0)
    p.add_argument("--head-f32", action="store_true", help="the embedding, final norm and head in f32 (f32 logits)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block (before FSDP2 shards it)")
    p.add_argument("--tf32", action="store_true", help="f32 products on a GPU in TF32 (with --dtype f32: speed)")
    p.add_argument("--rounding", choices=["hf", "rope", "once", "fused"], default="hf",
                   help="hf: transformers' bf16 ops as they are; rope: rope in f32, rounded once; once: rope, "
                        "RMSNorm and SwiGLU in f32, each rounded once; fused: those, and the output projections "
                        "added to the residual stream in f32 and rounded once (as shardtrain's kernels)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=0)
    q = sub.add_parser("plot")
    q.add_argument("--out", required=True)
    q.add_argument("--png")
    q.add_argument("--reference", default="pytorch",
                   help="the PyTorch run the others are held against (pytorch, or a variant such as pytorch-compile)")
    q.add_argument("--title", default="shardtrain and PyTorch (HF transformers + FSDP2), same init and batches")
    k = sub.add_parser("reference")
    k.add_argument("--from", required=True)
    k.add_argument("--to", required=True)
    c = sub.add_parser("check")
    c.add_argument("--out", required=True)
    c.add_argument("--reference", required=True)
    c.add_argument("--first-limit", type=float, default=1e-5)
    c.add_argument("--all-limit", type=float, default=1e-5)
    a = ap.parse_args()
    {"run": run, "pytorch": pytorch, "plot": plot, "reference": reference, "check": check}[a.cmd](a)


if __name__ == "__main__":
    main()
