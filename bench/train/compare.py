#!/usr/bin/env python3
"""End-to-end training benchmark, shardtrain against its PyTorch peer, as one command.

Runs shardtrain's benchmark binary (bench/train/train_bench.cpp) and the peer script
(bench/train/peer_fsdp2.py, HF transformers + FSDP2) one configuration ("row") after
another, streams each run's output to stderr prefixed by the row's name, and prints one
markdown table on stdout at the end, followed by shardtrain-over-peer ratios.

  python3 bench/train/compare.py [--preset 1b|1b-2d|8b] [--gpus G] [--rows NAME,NAME,...]
                                 [--steps N] [--warmup N] [--train-bench PATH]
                                 [--python PATH] [--torchrun CMD] [--timeout SECONDS]
                                 [--json PATH] [--list] [--dry-run]

Presets (sequence 4096, random tokens, the shapes of BENCHMARKS.md):
  1b  one GPU, Llama-3.2-1B shape. shardtrain runs with --graph (the step as a CUDA graph,
      as the trainer does), 6 timed steps after 2 warm-up; the peer 6 after 3 (compile
      needs one more warm-up step). Rows:
        ours-bs4, ours-bs4-shards, ours-bs8, ours-bs8-shards, ours-bs10-shards,
        ours-bs8-pointwise-shards, ours-bs4x2-pointwise, ours-bs8-selective-shards,
        ours-bs8-full-shards,
      (bs4x2: two micro-batches of 4 per optimizer step, the global batch of bs 8 at the
      memory of bs 4, within 35 GiB; -shards: --compute-shards, AdamW's bf16 copies of the
      weights used in place, the trainer's default where they fit)
        peer-eager-bs4, peer-compile-bs4, peer-eager-bs8-full, peer-compile-bs8-full
  1b-2d  G GPUs of one host (--gpus, default 2), Llama-3.2-1B shape: data parallel (FSDP)
      against data x tensor parallel (groups of 2 GPUs sharing a batch: the trainer's
      parallel.tensor_parallel, the peer's torchtitan plan), every row started by torchrun; 6
      timed steps after 2 warm-up (the peer 6 after 3); --batch is per data-parallel rank,
      so a -tp2 row's batch/GPU column reads "8 / 2 GPUs". Rows:
        ours-bs4, ours-bs8-tp2, ours-bs8-full, ours-bs8-full-tp2, ours-bs16-full-tp2,
        peer-compile-bs4, peer-compile-bs8-tp2, peer-eager-bs8-tp2, peer-compile-bs8-full,
        peer-compile-bs8-full-tp2, peer-compile-bs16-full-tp2,
      and hybrid sharding with 2 replicas (-rep2: the trainer's parallel.replicate, the peer's
      fully_shard on a (replicate, shard) mesh; on 2 GPUs, replicas of one GPU each: DDP):
        ours-bs4-rep2, ours-bs4-shards-rep2, peer-compile-bs4-rep2
  8b  G GPUs of one host (--gpus, default 2), Llama-3.1-8B shape, sharded, every row
      started by torchrun; 4 timed steps after 2 warm-up on both sides; --batch is per
      GPU. NCCL_NVLS_ENABLE=0 is set unless the environment already sets it. Rows:
        ours-bs1, ours-bs2, ours-bs4-full,
        peer-eager-bs1, peer-eager-bs2, peer-compile-bs2, peer-eager-bs4-full

Options:
  --preset 1b|1b-2d|8b  which set of rows (default 1b)
  --gpus G            GPUs per row for --preset 1b-2d and 8b (default 2); --preset 1b uses one
  --rows A,B,...      run only these rows, in this order (names as --list prints them)
  --steps N           timed steps for every row (default: the preset's)
  --warmup N          warm-up steps for every row (default: the preset's)
  --train-bench PATH  the shardtrain benchmark binary (default .device-build/bin/train_bench
                      when it exists, else build/bench/train_bench; relative defaults are
                      taken from the repository root). When it lies in <dir>/bin and
                      <dir>/lib exists (scripts/device_bundle.sh's layout), <dir>/lib is
                      put in front of LD_LIBRARY_PATH for its rows.
  --python PATH       interpreter for the one-GPU peer rows (default python3)
  --torchrun CMD      launcher for the several-GPU rows (default torchrun; split as a
                      shell would, e.g. "python3 -m torch.distributed.run")
  --timeout SECONDS   wall-clock limit of each row (default 900); a row over it is killed
  --json PATH         also write every row's outcome and parsed JSON result as a JSON list
  --list              print the preset's row names and commands, run nothing
  --dry-run           print the selected rows' commands, run nothing

Every command runs from the repository root. A row fails when its command exits non-zero,
runs past --timeout, or prints no JSON line with an "engine" key on stdout (the last such
line is taken); its table row then says "failed: <reason>", usually the last error line
of its stderr (an out-of-memory message, say), and the remaining rows still run.

Output: the table `| engine | AC | batch/GPU | tokens/s/GPU | MFU | peak GiB |
fwd / bwd / optimizer | board |` (the phases for shardtrain rows only; with several GPUs
they also give the share of the step spent waiting on communication; board: rank 0's GPU
over the timed steps as both programs read it through NVML: mean power, SM clock, the
share of samples in which the power cap held the clock down, energy per token), then for each
shardtrain row its tokens/s over each peer row at equal settings (same AC and batch) and
over the fastest peer row with the same AC at any batch, each with the peak-memory ratio.

Exit status: 0 when every row succeeded, 1 when a row failed, 2 for a usage error,
130 when interrupted (the table of the rows run so far is still printed).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = "bench/train/peer_fsdp2.py"  # relative to REPO, where every command runs
DEFAULT_TRAIN_BENCH = (".device-build/bin/train_bench", "build/bench/train_bench")


# ----------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    side: str  # "ours" (train_bench) or "peer" (peer_fsdp2.py)
    batch: int  # per GPU and micro-batch
    ac: str  # none | pointwise | selective | full (the peer knows only none | full)
    compile: bool = False  # peer only: torch.compile per block
    accum: int = 1  # ours only: micro-batches per optimizer step
    shards: bool = False  # ours only: --compute-shards (the trainer's parallel.compute_shards)
    tp: int = 1  # GPUs per tensor-parallel group, sharing `batch` (then per group, not per GPU)
    replicate: int = 1  # replicas of the sharded model (HSDP; the GPUs: DDP)

    @property
    def batch_text(self) -> str:
        text = str(self.batch) if self.accum == 1 else f"{self.batch} x {self.accum}"
        return text if self.tp == 1 else f"{text} / {self.tp} GPUs"

    @property
    def ours(self) -> bool:
        return self.side == "ours"


@dataclasses.dataclass(frozen=True)
class Preset:
    shape: str
    title: str
    multi_gpu: bool  # rows start under torchrun; train_bench then runs without --graph
    steps: dict  # side -> (timed steps, warm-up steps)
    rows: tuple


def _ours(batch: int, ac: str = "none", accum: int = 1, shards: bool = False, tp: int = 1, rep: int = 1) -> Row:
    name = (f"ours-bs{batch}" + ("" if accum == 1 else f"x{accum}") + ("" if ac == "none" else f"-{ac}")
            + ("-shards" if shards else "") + ("" if tp == 1 else f"-tp{tp}") + ("" if rep == 1 else f"-rep{rep}"))
    return Row(name, "ours", batch, ac, accum=accum, shards=shards, tp=tp, replicate=rep)


def _peer(batch: int, compile_: bool, ac: str = "none", tp: int = 1, rep: int = 1) -> Row:
    mode = "compile" if compile_ else "eager"
    return Row(f"peer-{mode}-bs{batch}" + ("" if ac == "none" else f"-{ac}") + ("" if tp == 1 else f"-tp{tp}")
               + ("" if rep == 1 else f"-rep{rep}"), "peer", batch, ac, compile_, tp=tp, replicate=rep)


PRESETS = {
    "1b": Preset(
        shape="1b",
        title="Llama-3.2-1B shape, sequence 4096",
        multi_gpu=False,
        # torch.compile settles in one more step than eager code, hence the peer's extra warm-up
        steps={"ours": (6, 2), "peer": (6, 3)},
        rows=(_ours(4), _ours(4, shards=True), _ours(8), _ours(8, shards=True), _ours(10, shards=True),
              _ours(8, "pointwise", shards=True), _ours(4, "pointwise", 2),
              _ours(8, "selective", shards=True), _ours(8, "full", shards=True),
              _peer(4, False), _peer(4, True), _peer(8, False, "full"), _peer(8, True, "full")),
    ),
    "1b-2d": Preset(
        shape="1b",
        title="Llama-3.2-1B shape, sequence 4096, data parallel against data x tensor parallel",
        multi_gpu=True,
        steps={"ours": (6, 2), "peer": (6, 3)},
        rows=(_ours(4), _ours(8, tp=2), _ours(8, "full"), _ours(8, "full", tp=2), _ours(16, "full", tp=2),
              _peer(4, True), _peer(8, True, tp=2), _peer(8, False, tp=2), _peer(8, True, "full"),
              _peer(8, True, "full", tp=2), _peer(16, True, "full", tp=2),
              _ours(4, rep=2), _ours(4, shards=True, rep=2), _peer(4, True, rep=2)),
    ),
    "8b": Preset(
        shape="8b",
        title="Llama-3.1-8B shape, sequence 4096, sharded",
        multi_gpu=True,
        steps={"ours": (4, 2), "peer": (4, 2)},
        rows=(_ours(1), _ours(2), _ours(4, "full"),
              _peer(1, False), _peer(2, False), _peer(2, True), _peer(4, False, "full")),
    ),
}


def engine_label(row: Row, multi_gpu: bool) -> str:
    """The table's engine column, known before the run so that a failed row has one too."""
    if row.ours:
        engine = "shardtrain" if multi_gpu else "shardtrain (graph"
        if row.shards:
            engine += " + shards" if multi_gpu else ", shards"
        if row.tp > 1:
            engine += f" x TP{row.tp}"
        if row.replicate > 1:
            engine += f", {row.replicate} replicas"
        return engine if multi_gpu else engine + ")"
    peer = "HF + FSDP2" + (f" x TP{row.tp}" if row.tp > 1 else "") + (
        f" HSDP ({row.replicate} replicas)" if row.replicate > 1 else "")
    return peer + (" + compile" if row.compile else " eager")


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass
class Plan:
    """One row made concrete: what to run, with which environment changes."""
    row: Row
    label: str
    argv: list
    env: dict  # variable -> value set for this row
    prepend: dict  # variable -> directory put in front of a path-list variable


def build_plan(row: Row, preset: Preset, opts: argparse.Namespace) -> Plan:
    steps, warmup = preset.steps[row.side]
    steps = opts.steps if opts.steps is not None else steps
    warmup = opts.warmup if opts.warmup is not None else warmup
    shape = ["--shape", preset.shape] if preset.shape != "1b" else []  # 1b is both sides' default
    args = shape + ["--batch", str(row.batch), "--steps", str(steps), "--warmup", str(warmup)]
    if row.accum > 1:
        args += ["--accum", str(row.accum)]
    if row.shards:
        args.append("--compute-shards")
    if row.compile:
        args.append("--compile")
    if row.ac != "none":
        args += ["--ac", row.ac]
    if row.tp > 1:
        args += ["--tp", str(row.tp)]
    if row.replicate > 1:
        args += ["--replicate", str(row.replicate)]
    env, prepend = {}, {}
    if preset.multi_gpu and "NCCL_NVLS_ENABLE" not in os.environ:
        env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the GPU machines
    if row.ours:
        bench = display_path(opts.train_bench)
        lib = opts.train_bench.parent.parent / "lib"
        if opts.train_bench.parent.name == "bin" and lib.is_dir():
            prepend["LD_LIBRARY_PATH"] = display_path(lib)  # libraries bundled beside the binary
        if preset.multi_gpu:
            argv = opts.torchrun + ["--nproc-per-node", str(opts.gpus), "--no-python", bench] + args
        else:
            argv = [bench] + args + ["--graph"]  # the graph needs one GPU
    else:
        if preset.multi_gpu:
            argv = opts.torchrun + ["--nproc-per-node", str(opts.gpus), PEER_SCRIPT] + args
        else:
            argv = [opts.python, PEER_SCRIPT] + args
    return Plan(row, engine_label(row, preset.multi_gpu), argv, env, prepend)


def display_path(path: Path) -> str:
    """Paths inside the repository are shown (and run, from the root) relative to it."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(REPO)  # a symlinked binary keeps its name
    except ValueError:
        return str(path)
    text = str(rel)
    return text if "/" in text else "./" + text  # a bare name would be looked up on PATH


def shell_line(plan: Plan) -> str:
    """The command as one copy-pasteable shell line, environment changes in front."""
    parts = [f"{k}={shlex.quote(v)}" for k, v in plan.env.items()]
    parts += [f"{k}={shlex.quote(v)}:${k}" for k, v in plan.prepend.items()]
    return " ".join(parts + [shlex.join(plan.argv)])


def process_env(plan: Plan) -> dict:
    env = dict(os.environ)
    env.update(plan.env)
    for k, v in plan.prepend.items():
        env[k] = str(REPO / v) + (":" + env[k] if env.get(k) else "")
    env["PYTHONUNBUFFERED"] = "1"  # the peer's progress would otherwise arrive only at its end
    return env


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass
class Outcome:
    plan: Plan
    result: dict | None = None  # the parsed JSON line, tokens/s normalised
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result is not None and self.error is None


_print_lock = threading.Lock()


def _pump(pipe, name: str, keep) -> None:
    """Copies a child's pipe to our stderr line by line while keeping the lines."""
    for line in pipe:
        line = line.rstrip("\n")
        keep.append(line)
        with _print_lock:
            print(f"[{name}] {line}", file=sys.stderr, flush=True)
    pipe.close()


def _stop(proc: subprocess.Popen) -> None:
    """Ends the row's whole process group: torchrun's ranks must not outlive it and hold
    the GPUs the next row needs. SIGTERM first so that torchrun can tear its ranks down."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass


def run_plan(plan: Plan, timeout: float) -> Outcome:
    name = plan.row.name
    start = time.monotonic()
    try:
        proc = subprocess.Popen(plan.argv, cwd=REPO, env=process_env(plan), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1,
                                start_new_session=True)  # its own group, so _stop reaches every rank
    except OSError as e:
        return Outcome(plan, error=f"cannot start {plan.argv[0]}: {e.strerror or e}")
    out: list = []
    err = collections.deque(maxlen=400)  # only the tail matters for the failure reason
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, name, out), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, name, err), daemon=True)]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    except KeyboardInterrupt:
        _stop(proc)
        raise
    for t in pumps:
        t.join(10)  # a stray grandchild holding the pipe must not hang us
    outcome = Outcome(plan, seconds=time.monotonic() - start)
    if timed_out:
        outcome.error = f"timed out after {timeout:g} s"
    elif proc.returncode != 0:
        line = failure_line(list(err))
        code = f"exit {proc.returncode}" if proc.returncode > 0 else f"signal {-proc.returncode}"
        outcome.error = f"{code}: {line}" if line else code
    else:
        outcome.result = last_result(out)
        if outcome.result is None:
            outcome.error = "no JSON result line on stdout"
        elif outcome.result.get("tokens_per_s_per_gpu") is None:
            outcome.error, outcome.result = "its JSON line has no tokens/s", None
    return outcome


def last_result(lines: list) -> dict | None:
    """The last stdout line that parses as a JSON object with an "engine" key. A launcher
    may prefix rank output ("[rank0]: {...}"), so parsing starts at the first brace."""
    for line in reversed(lines):
        brace = line.find("{")
        if brace < 0:
            continue
        try:
            value = json.loads(line[brace:])
        except ValueError:
            continue
        if isinstance(value, dict) and "engine" in value:
            return normalise(value)
    return None


def normalise(result: dict) -> dict:
    """train_bench reports tokens_per_s (per GPU, as its header says), the peer
    tokens_per_s_per_gpu; everything below reads the latter."""
    r = dict(result)
    if r.get("tokens_per_s_per_gpu") is None and r.get("tokens_per_s") is not None:
        r["tokens_per_s_per_gpu"] = r["tokens_per_s"]
    return r


# An error worth showing, against the noise around it: torchrun's closing summary
# ("ChildFailedError", "====", "exitcode : 1") and its per-rank "Sending ... SIGTERM".
_ERROR_HINT = re.compile(r"out of memory|OutOfMemory|Error\b|error:|Exception|assert|train_bench:|NCCL WARN",
                         re.IGNORECASE)
_NOISE = re.compile(r"ChildFailedError|torch\.distributed\.elastic|^[\s=\-]*$|^\s*(traceback|error_file|exitcode)\s*:")


def failure_line(stderr_lines: list) -> str:
    """The line that says why a row failed: the last error-looking line of its stderr,
    else its last non-empty line, shortened for a table cell."""
    lines = [l.strip() for l in stderr_lines if l.strip() and not _NOISE.search(l)]
    pick = next((l for l in reversed(lines) if _ERROR_HINT.search(l)), lines[-1] if lines else "")
    return pick if len(pick) <= 160 else pick[:157] + "..."


# ----------------------------------------------------------------------------- report


def fmt_int(x) -> str:
    return f"{x:,.0f}"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def board_cell(r: dict) -> str:
    """The board over the timed steps (rank 0's GPU), where the row's program could read it."""
    if r.get("gpu_power_w") is None:
        return ""
    return (f"{r['gpu_power_w']:.0f} W, {r['gpu_sm_mhz']:.0f} MHz, {100 * r['gpu_power_capped']:.0f} % capped, "
            f"{r['mj_per_token']:.1f} mJ/token")


def table(outcomes: list, multi_gpu: bool) -> list:
    last = "fwd / bwd / optimizer" + (", comm wait" if multi_gpu else "")
    lines = [f"| engine | AC | batch/GPU | tokens/s/GPU | MFU | peak GiB | {last} | board |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        row, r = o.plan.row, o.result
        if not o.ok:
            cells = [o.plan.label, row.ac, row.batch_text, f"failed: {o.error}", "", "", "", ""]
        else:
            phases = ""
            if row.ours and r.get("forward_ms") is not None:
                phases = f"{r['forward_ms']:.0f} / {r['backward_ms']:.0f} / {r['optimizer_ms']:.0f} ms"
                if r.get("gpus", 1) > 1 and r.get("comm_wait_fraction") is not None:
                    phases += f", {100 * r['comm_wait_fraction']:.1f} %"
            cells = [o.plan.label, str(r.get("ac", row.ac)), row.batch_text,
                     fmt_int(r["tokens_per_s_per_gpu"]), f"{100 * r.get('mfu', 0):.1f} %",
                     f"{r.get('peak_gib', 0):.1f}", phases, board_cell(r)]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return lines


def _versus(ours: Outcome, peer: Outcome, what: str) -> str:
    a, b = ours.result, peer.result
    speed = a["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"]
    mem = f"peak {a['peak_gib']:.1f} vs {b['peak_gib']:.1f} GiB"
    if b.get("peak_gib"):
        mem += f" ({a['peak_gib'] / b['peak_gib']:.2f}x)"
    return f"- {ours.plan.row.name} vs {peer.plan.row.name}, {what}: {speed:.2f}x tokens/s, {mem}"


def ratios(outcomes: list) -> list:
    """shardtrain over the peer, only among rows that succeeded. AC and batch are read
    from each row's definition: the JSON line echoes them, so they agree."""
    ours = [o for o in outcomes if o.ok and o.plan.row.ours]
    peers = [o for o in outcomes if o.ok and not o.plan.row.ours]
    if not ours or not peers:
        return ["No ratios: they need a shardtrain row and a peer row that both succeeded."]
    lines = ["Ratios, shardtrain over peer (tokens/s per GPU; peak memory):"]
    for o in ours:
        row = o.plan.row
        same_ac = [p for p in peers if p.plan.row.ac == row.ac]
        if not same_ac:
            lines.append(f"- {row.name}: no peer row with AC {row.ac} succeeded (the peer has none and full)")
            continue
        best = max(same_ac, key=lambda p: p.result["tokens_per_s_per_gpu"])
        fastest = f"the fastest peer with AC {row.ac}"
        for p in same_ac:
            if p.plan.row.batch == row.batch and p.plan.row.tp == row.tp and row.accum == 1:
                what = (f"equal settings (AC {row.ac}, batch {row.batch_text})"
                        + (f", also {fastest}" if p is best else ""))
                lines.append(_versus(o, p, what))
        if best.plan.row.batch != row.batch or best.plan.row.tp != row.tp or row.accum != 1:
            lines.append(_versus(o, best, f"{fastest} (batch {best.plan.row.batch_text})"))
    return lines


def write_json(path: str, outcomes: list) -> None:
    data = [dict(row=o.plan.row.name, command=shell_line(o.plan),
                 ok=o.ok, error=o.error, seconds=round(o.seconds, 1), result=o.result) for o in outcomes]
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


# ----------------------------------------------------------------------------- options


def parse_args(argv: list) -> tuple[argparse.Namespace, Preset, list]:
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--rows", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--train-bench", default=None)
    p.add_argument("--python", default="python3")
    p.add_argument("--torchrun", default="torchrun")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default=None)
    p.add_argument("--list", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    preset = PRESETS[a.preset]

    if preset.multi_gpu:
        a.gpus = 2 if a.gpus is None else a.gpus
        if a.gpus < 1:
            p.error(f"--gpus must be at least 1, found {a.gpus}")
    elif a.gpus not in (None, 1):
        p.error(f"--preset {a.preset} runs on one GPU; --gpus is for the several-GPU presets")
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps must be at least 1, found {a.steps}")
    if a.warmup is not None and a.warmup < 0:
        p.error(f"--warmup must be 0 or more, found {a.warmup}")
    if a.timeout <= 0:
        p.error(f"--timeout must be positive, found {a.timeout:g}")
    a.torchrun = shlex.split(a.torchrun)
    if not a.torchrun:
        p.error("--torchrun is empty")
    if a.train_bench is None:
        a.train_bench = next((REPO / d for d in DEFAULT_TRAIN_BENCH if (REPO / d).exists()),
                             REPO / DEFAULT_TRAIN_BENCH[-1])
    else:
        a.train_bench = Path(a.train_bench).expanduser().absolute()  # as the caller sees it

    rows = list(preset.rows)
    if a.rows is not None:
        rows = select_rows(p, a.preset, a.rows)
    return a, preset, rows


def select_rows(p: argparse.ArgumentParser, preset_name: str, spec: str) -> list:
    by_name = {r.name: r for r in PRESETS[preset_name].rows}
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        p.error("--rows is empty")
    unknown = [n for n in names if n not in by_name]
    if unknown:
        # a name of the other preset is the likeliest slip: say so
        elsewhere = [f"{n} is a row of --preset {other}" for n in unknown for other, pr in PRESETS.items()
                     if other != preset_name and n in {r.name for r in pr.rows}]
        hint = f" ({'; '.join(elsewhere)})" if elsewhere else ""
        p.error(f"unknown row {', '.join(unknown)}{hint}; rows of --preset {preset_name}: "
                + ", ".join(by_name))
    return [by_name[n] for n in dict.fromkeys(names)]  # order as given, each once


def check_runnable(plans: list, opts: argparse.Namespace) -> str | None:
    """What is missing to run the selected rows, as a message, or None."""
    if any(pl.row.ours for pl in plans):
        tb = opts.train_bench
        if not tb.is_file() or not os.access(tb, os.X_OK):
            return (f"no train_bench binary at {tb}: build it with scripts/build.sh "
                    f"(it lands in build/bench/train_bench), or pass --train-bench PATH")
    if any(not pl.row.ours for pl in plans) and not (REPO / PEER_SCRIPT).is_file():
        return f"the peer script {REPO / PEER_SCRIPT} is missing"
    launchers = {pl.argv[0] for pl in plans if pl.argv[0] in (opts.python, opts.torchrun[0])}
    for exe in sorted(launchers):
        if shutil.which(exe) is None:
            return f"{exe} not found (see --python and --torchrun)"
    return None


# ----------------------------------------------------------------------------- main


def main(argv: list) -> int:
    opts, preset, rows = parse_args(argv)
    gpus = opts.gpus if preset.multi_gpu else 1
    where = f"{gpus} GPU{'s' if gpus > 1 else ''}" if preset.multi_gpu else "one GPU"

    if opts.list:
        print(f"Rows of --preset {opts.preset} ({preset.title}, {where}); run from {REPO}:")
        for row in preset.rows:
            plan = build_plan(row, preset, opts)
            print(f"  {row.name:<27}{plan.label}, AC {row.ac}, batch {row.batch_text}/GPU")
            print(f"  {'':<27}{shell_line(plan)}")
        return 0

    plans = [build_plan(r, preset, opts) for r in rows]
    if opts.dry_run:
        print(f"# --preset {opts.preset}: {preset.title}, {where}; from {REPO}, "
              f"each row limited to {opts.timeout:g} s")
        for plan in plans:
            print(f"# {plan.row.name}\n{shell_line(plan)}")
        return 0

    problem = check_runnable(plans, opts)
    if problem:
        print(f"compare.py: error: {problem}", file=sys.stderr)
        return 2

    outcomes, interrupted = [], False
    for i, plan in enumerate(plans, 1):
        print(f"[{plan.row.name}] ({i}/{len(plans)}) {shell_line(plan)}", file=sys.stderr, flush=True)
        try:
            o = run_plan(plan, opts.timeout)
        except KeyboardInterrupt:
            outcomes.append(Outcome(plan, error="interrupted"))
            interrupted = True
            left = len(plans) - i
            print(f"compare.py: interrupted in {plan.row.name}; {left} row(s) not run", file=sys.stderr)
            break
        outcomes.append(o)
        state = f"{fmt_int(o.result['tokens_per_s_per_gpu'])} tokens/s/GPU" if o.ok else f"failed: {o.error}"
        print(f"[{plan.row.name}] done in {o.seconds:.0f} s: {state}", file=sys.stderr, flush=True)

    print()
    print("\n".join(table(outcomes, preset.multi_gpu)))
    print()
    print("\n".join(ratios(outcomes)))
    if opts.json:
        write_json(opts.json, outcomes)
    if interrupted:
        return 130
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
