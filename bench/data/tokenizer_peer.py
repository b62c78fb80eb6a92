#!/usr/bin/env python3
"""The peer of bench/data/tokenizer_bench: HF `tokenizers` (Rust, via PyPI) encoding the same
corpus, one document per line, with 1 thread and with all threads (encode_batch).

  python3 bench/data/tokenizer_peer.py [corpus.txt] [tokenizer.json]
"""
import os
import sys
import time

shared = os.path.join(os.path.dirname(__file__), "../../../shared/data")
corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(shared, "corpus/world_english_bible.txt")
tok_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(shared, "tokenizers/llama3/tokenizer.json")

with open(corpus, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f if line.strip()]
size_mb = sum(len(line.encode()) for line in lines) / 1e6


def run(threads):
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    from tokenizers import Tokenizer  # imported after setting the thread count

    tok = Tokenizer.from_file(tok_path)
    tok.encode_batch(lines[:1000], add_special_tokens=False)  # warm-up
    t = time.perf_counter()
    out = tok.encode_batch(lines, add_special_tokens=False)
    dt = time.perf_counter() - t
    return sum(len(e.ids) for e in out), dt


if __name__ == "__main__":
    threads = int(os.environ.get("PEER_THREADS", os.cpu_count()))
    n, dt = run(threads)
    print(f"HF tokenizers {threads} thread(s): {size_mb:.2f} MB, {n} tokens, {dt:.3f} s, {size_mb / dt:.1f} MB/s")
