"""torchtitan 0.2.2's context parallelism, the same-run peer of `shardtrain bench` with
parallel.context_parallel: torchtitan's llama3 model and parallelize_llama with ParallelDims(cp=N)
(FSDP over the dp_shard x cp ranks; context parallelism on every attention module through
PyTorch's experimental context_parallel, SDPA, the head-tail load balancer), full activation
checkpointing, per-block torch.compile, fused AdamW, random tokens; one sequence of --seq tokens a
step split over the N ranks, the Llama 3.1 8B width with --layers blocks. Prints the step times and
a RESULT json line (tokens/s per GPU; MFU counted as shardtrain counts it).

The source is torchtitan's v0.2.2 tarball (../shared/peer/torchtitan-v0.2.2-src.tar.xz), unpacked
into vendor/ beside this file; the packages its imports name but this path never uses (datasets,
torchdata, tyro) are stubbed where missing.

  mkdir -p bench/train/vendor && tar -xJf torchtitan-v0.2.2-src.tar.xz -C bench/train/vendor
  torchrun --standalone --nproc-per-node 2 bench/train/peer_titan_cp.py --seq 131072 --layers 4
"""
import argparse, json, os, sys, time, traceback, types, importlib.util
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
VENDOR = os.path.join(HERE, "vendor", "torchtitan")


def _pkg(name, path=None):
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    sys.modules[name] = m
    return m


def install_stubs():
    from unittest.mock import MagicMock
    if importlib.util.find_spec("datasets") is None:
        ds = _pkg("datasets", ""); ds.Dataset = type("Dataset", (), {}); ds.load_dataset = lambda *a, **k: None
        dsd = _pkg("datasets.distributed", ""); dsd.split_dataset_by_node = lambda *a, **k: None; ds.distributed = dsd
    if importlib.util.find_spec("torchdata") is None:
        td = _pkg("torchdata", ""); tds = _pkg("torchdata.stateful_dataloader", "")
        tds.StatefulDataLoader = torch.utils.data.DataLoader; td.stateful_dataloader = tds
    if importlib.util.find_spec("tyro") is None:
        ty = MagicMock(name="tyro"); sys.modules["tyro"] = ty; sys.modules["tyro.constructors"] = ty.constructors
    sys.path.insert(0, VENDOR)
    _pkg("torchtitan", os.path.join(VENDOR, "torchtitan"))
    _pkg("torchtitan.models", os.path.join(VENDOR, "torchtitan", "models"))
    _pkg("torchtitan.models.llama3", os.path.join(VENDOR, "torchtitan", "models", "llama3"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    install_stubs()
    import torchtitan.distributed  # noqa: F401
    from torchtitan.config import JobConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input
    from torchtitan.models.llama3.model.args import TransformerModelArgs as Args
    from torchtitan.models.llama3.model.model import Transformer
    from torchtitan.components.loss import cross_entropy_loss
    try:
        import torchtitan.models.llama3.infra.parallelize as par
    except AttributeError:
        path = os.path.join(VENDOR, "torchtitan", "models", "llama3", "infra", "parallelize.py")
        src = open(path).read().replace("    torch.ops.torch_attn._varlen_attn.default,\n", "")
        par = types.ModuleType("torchtitan.models.llama3.infra.parallelize"); par.__file__ = path
        sys.modules[par.__name__] = par
        exec(compile(src, path, "exec"), par.__dict__)
    pd = ParallelDims(dp_replicate=1, dp_shard=-1, cp=world, tp=1, pp=1, ep=1, etp=1, world_size=world)
    pd.build_mesh()
    seq = a.seq
    jc = JobConfig()
    jc.training.seq_len = seq
    jc.training.local_batch_size = 1
    jc.training.mixed_precision_param = "bfloat16"
    jc.training.mixed_precision_reduce = "float32"
    jc.compile.enable = True
    jc.compile.components = ["model", "loss"]
    jc.activation_checkpoint.mode = "full"
    jc.job.dump_folder = "/tmp/titan_dump"
    args = Args(dim=4096, n_layers=a.layers, n_heads=32, n_kv_heads=8, vocab_size=128256, multiple_of=1024,
                ffn_dim_multiplier=1.3, rope_theta=500000, max_seq_len=seq)
    with torch.device("meta"):
        model = Transformer(args)
    n_total = sum(p.numel() for p in model.parameters())
    n_embed = model.tok_embeddings.weight.numel()
    par.parallelize_llama(model, pd, jc)
    model.to_empty(device="cuda")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    loss_fn = torch.compile(cross_entropy_loss)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    cp_mesh = pd.get_mesh("cp")
    g = torch.Generator(device="cuda").manual_seed(7)

    def step():
        toks = torch.randint(0, args.vocab_size, (1, seq + 1), device="cuda", generator=g)
        x, y = toks[:, :-1], toks[:, 1:]
        x, y, extra = prepare_context_parallel_input(x, y, {}, cp_mesh, torch.device("cuda"), "headtail")
        pred = model(x, **extra)
        loss = loss_fn(pred, y) / seq
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize(); dt = time.perf_counter() - t0
        if rank == 0:
            print(f"# step {i + 1} loss {loss.item():.4f} {dt:.2f} s", flush=True)
        if i >= a.warmup:
            times.append(dt)
    tps = seq / (sum(times) / len(times)) / world
    hd = args.dim // args.n_heads
    fpt = 6 * (n_total - n_embed) + 12 * args.n_layers * hd * args.n_heads * seq
    if rank == 0:
        print("RESULT " + json.dumps(dict(impl="torchtitan-v0.2.2 context parallel", cp=world, seq=seq,
                                          layers=args.n_layers, tokens_per_s_per_gpu=round(tps, 1),
                                          mfu=round(fpt * tps / 989e12, 4), step_s=round(sum(times) / len(times), 2),
                                          peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
