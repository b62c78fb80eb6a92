"""The peer of `shardtrain generate --device cuda`: Hugging Face transformers' generate on the
same Hugging Face folder, bf16 on the GPU, greedy, its KV cache (DynamicCache), SDPA attention.

    python3 bench/train/generate_peer.py FOLDER [--prompt-tokens 55] [--tokens 400]

Prints the tokens per second after the first token: (tokens - 1) / (time for `tokens` new
tokens - time for one), each the median of three timed calls after a warm-up, and the total.
The prompt is random ids (speed does not depend on their values); EOS is ignored so that
exactly `tokens` come out.
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def timed(model, ids, tokens):
    runs = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
        assert out.shape[1] == ids.shape[1] + tokens, out.shape
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--prompt-tokens", type=int, default=55)
    p.add_argument("--tokens", type=int, default=400)
    a = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.folder, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, a.prompt_tokens), generator=g).cuda()
    with torch.no_grad():
        timed(model, ids, 8)  # warm-up
        one = timed(model, ids, 1)
        full = timed(model, ids, a.tokens)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}: "
          f"{a.tokens} tokens in {full:.3f} s, {a.tokens / full:.1f} tokens/s; first token after {one:.3f} s, "
          f"then {(a.tokens - 1) / (full - one):.1f} tokens/s")


if __name__ == "__main__":
    main()
