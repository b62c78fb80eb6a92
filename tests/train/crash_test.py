#!/usr/bin/env python3
"""Kills a training run again and again, mostly in the middle of its checkpoint saves and its
export, resumes it each time, and checks that nothing was lost:

  * after every kill, `latest` (when there is one) passes `shardtrain inspect --verify`: every
    rank file whole, every tensor matching its checksum, every value finite;
  * an export folder that exists after a kill is one whole export (inspect --verify);
  * no temporary save or export folders outlive the next launch;
  * the run, resumed after every kill, ends with the same losses at every step, the same
    checkpoint files and the same export, byte for byte, as one straight run.

Kills come at three kinds of moments, in turn: as soon as a save's temporary folder appears, as
soon as the export's temporary folder appears, and at a random time. With --ranks N > 1 the
ranks run under mpirun and the whole launch is killed at once.

  python3 tests/train/crash_test.py --binary build/shardtrain --kills 6              (short)
  python3 tests/train/crash_test.py --binary build/shardtrain --kills 50 --ranks 2   (long)

Exit status 0 when every check passed; each failure is printed with the kill it followed.
"""
import argparse
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def tiny_job(out, steps, async_saves, export):
    return [
        "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
        "--model.ffn_dim=128", "--model.max_seq_len=64", "--training.seq_len=32",
        "--training.batch_size=4", f"--training.steps={steps}", "--training.device=cpu",
        "--training.threads=1", "--schedule.warmup_steps=2", "--eval.interval_steps=0",
        "--eval.batches=1", "--sample.tokens=0", "--logging.interval_steps=1",
        "--logging.progress=off", "--checkpoint.interval_steps=1", "--checkpoint.keep=2",
        f"--checkpoint.async={'true' if async_saves else 'false'}", "--checkpoint.resume=auto",
        f"--run.output_dir={out}", f"--export.folder={export}", "--export.dtype=f32",
        "--parallel.timeout_s=60",
    ]


def launch(binary, ranks, job, log):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if ranks == 1:
        cmd = [binary, "train"] + job
    else:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl="self,vader")
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", binary, "train"] + job
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    # every process of the launch gone (mpirun's ranks are in its group too)
    for _ in range(200):
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def temporary_folders(root):
    found = glob.glob(os.path.join(root, "checkpoints", ".step_*.tmp"))
    found += glob.glob(os.path.join(root, "export.tmp.*")) + glob.glob(os.path.join(root, "export.old.*"))
    return found


def read_latest(run):
    """The step `latest` names, 0 when there is none."""
    try:
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            return int(f.read().strip()[len("step_"):])
    except FileNotFoundError:
        return 0


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def losses(run):
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                out[r["step"]] = r["loss"]
    return out


def final_files(run):
    """Checksums of the newest checkpoint's rank files and of the export's files."""
    ckpt = os.path.join(run, "checkpoints")
    with open(os.path.join(ckpt, "latest")) as f:
        step_dir = os.path.join(ckpt, f.read().strip())
    files = {os.path.basename(step_dir) + "/" + os.path.basename(p): sha256(p)
             for p in sorted(glob.glob(os.path.join(step_dir, "rank_*.safetensors")))}
    for p in sorted(glob.glob(os.path.join(run, "export", "*"))):
        files["export/" + os.path.basename(p)] = sha256(p)
    return files


def verify(binary, path):
    r = subprocess.run([binary, "inspect", "--verify", path], capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/shardtrain")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (default: 2 per kill, at least 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--async-saves", action="store_true", help="checkpoint.async = true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    binary = os.path.abspath(a.binary)
    steps = a.steps or max(8, 2 * a.kills)
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="shardtrain_crash_")
    failures = []

    def fail(what):
        failures.append(what)
        print("FAIL:", what, flush=True)

    # the straight run
    straight = os.path.join(work, "straight")
    os.makedirs(straight)
    t0 = time.time()
    with open(os.path.join(work, "straight.log"), "w") as log:
        rc = launch(binary, a.ranks, tiny_job(straight, steps, a.async_saves, os.path.join(straight, "export")), log).wait()
    straight_s = time.time() - t0
    if rc != 0:
        print(open(os.path.join(work, "straight.log")).read()[-3000:])
        print("the straight run failed; nothing to compare with")
        return 1
    print(f"straight run: {steps} steps on {a.ranks} rank(s) in {straight_s:.1f} s", flush=True)

    crashed = os.path.join(work, "crashed")
    os.makedirs(crashed)
    job = tiny_job(crashed, steps, a.async_saves, os.path.join(crashed, "export"))
    kinds = {"save": 0, "export": 0, "random": 0}
    finished_first = 0
    kills = 0
    attempt = 0
    while kills < a.kills:
        attempt += 1
        if attempt > 4 * a.kills + 10:
            fail(f"only {kills} kills landed in {attempt - 1} launches")
            break
        kind = ("save", "export", "random")[kills % 3]
        latest_before = read_latest(crashed)
        # a save: of a step after the newest checkpoint; its temporary folder is the moment
        target = rng.randint(latest_before + 1, steps) if latest_before < steps else steps
        with open(os.path.join(work, f"launch_{attempt:03}.log"), "w") as log:
            p = launch(binary, a.ranks, job, log)
            deadline = time.time() + max(10.0, 3 * straight_s)
            delay = rng.uniform(0.05, 0.7 * straight_s)
            start = time.time()
            moment = ""
            while p.poll() is None and time.time() < deadline:
                if kind == "save":
                    if os.path.exists(os.path.join(crashed, "checkpoints", f".step_{target:08}.tmp")):
                        moment = f"in the save of step {target}"
                elif kind == "export":
                    if glob.glob(os.path.join(crashed, "export.tmp.*")):
                        moment = "in the export"
                elif time.time() - start >= delay:
                    moment = f"{time.time() - start:.2f} s after the launch"
                if moment:
                    break
                time.sleep(0.0005)
            if p.poll() is not None or not moment:
                finished_first += 1
                if p.poll() is None:
                    kill_group(p)
                    fail(f"launch {attempt} ran past its deadline (log: launch_{attempt:03}.log)")
                    break
                if p.returncode != 0:
                    fail(f"launch {attempt} exited with {p.returncode} (log: launch_{attempt:03}.log)")
                    break
                # a finished run: start it over from scratch, so the remaining kills still land in saves
                shutil.rmtree(crashed)
                os.makedirs(crashed)
                continue
            kill_group(p)
        left = [os.path.basename(t) for t in temporary_folders(crashed)]
        print(f"kill {kills + 1} {moment}: latest = step {read_latest(crashed)}, export "
              f"{'present' if os.path.isdir(os.path.join(crashed, 'export')) else 'absent'}"
              f"{', left: ' + ' '.join(left) if left else ''}", flush=True)
        kills += 1
        kinds[kind] += 1
        latest = os.path.join(crashed, "checkpoints", "latest")
        if os.path.exists(latest):
            ok, text = verify(binary, os.path.join(crashed, "checkpoints"))
            if not ok:
                fail(f"after kill {kills} ({kind}): `latest` does not verify:\n{text}")
        export = os.path.join(crashed, "export")
        if os.path.exists(export):
            ok, text = verify(binary, export)
            if not ok:
                fail(f"after kill {kills} ({kind}): the export folder does not verify:\n{text}")

    # run to the end, then compare with the straight run
    with open(os.path.join(work, "final.log"), "w") as log:
        rc = launch(binary, a.ranks, job, log).wait()
    if rc != 0:
        fail(f"the last resume exited with {rc}:\n" + open(os.path.join(work, "final.log")).read()[-3000:])
    else:
        left = temporary_folders(crashed)
        if left:
            fail(f"temporary folders left after the last run: {left}")
        a_losses, b_losses = losses(straight), losses(crashed)
        if a_losses != b_losses:
            diff = [s for s in sorted(set(a_losses) | set(b_losses)) if a_losses.get(s) != b_losses.get(s)]
            fail(f"losses differ from the straight run at steps {diff[:10]}")
        a_files, b_files = final_files(straight), final_files(crashed)
        if a_files != b_files:
            diff = sorted(k for k in set(a_files) | set(b_files) if a_files.get(k) != b_files.get(k))
            fail(f"files differ from the straight run: {diff}")
    print(f"{kills} kills ({kinds['save']} in a save, {kinds['export']} in the export, {kinds['random']} at a random "
          f"time; {finished_first} launches finished before their kill), {a.ranks} rank(s), {steps} steps: "
          f"{len(failures)} failure(s)", flush=True)
    if a.keep or failures:
        print("work folder:", work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
