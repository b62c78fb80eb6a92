#!/usr/bin/env python3
"""shardtrain's loss curve against PyTorch's on the tiny CPU job of bench/train/convergence.py (f32,
100 steps, bytes of Shakespeare): the same initial weights (their CRC32C) and batches (their
SHA-256) as the kept PyTorch run, each of the first 20 steps' losses within 1e-5 of PyTorch's, and
every loss within the limit `check` states. The PyTorch curve is kept in
bench/train/convergence_reference/tiny-cpu (PyTorch is too heavy for this machine); the command in
that folder's README remakes it.

Exit 77 (skipped) when ../shared/data is not beside the repository."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONVERGENCE = os.path.join(ROOT, "bench", "train", "convergence.py")
REFERENCE = os.path.join(ROOT, "bench", "train", "convergence_reference", "tiny-cpu")
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "corpus", "tinyshakespeare.txt")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    a = ap.parse_args()
    if not os.path.exists(DATA):
        print(f"SKIPPED: {DATA} is not there (../shared beside the repository holds the corpus)")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="shardtrain_convergence_") as out:
        subprocess.check_call([sys.executable, CONVERGENCE, "run", "--job", "tiny-cpu", "--engines", "shardtrain",
                               "--shardtrain", a.binary, "--data", DATA, "--out", out])
        sys.exit(subprocess.call([sys.executable, CONVERGENCE, "check", "--out", out, "--reference", REFERENCE]))


if __name__ == "__main__":
    main()
