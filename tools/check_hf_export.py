#!/usr/bin/env python3
"""Checks that folders exported by shardtrain load unchanged in transformers and give the
logits recorded in the matching reference file (see tools/make_hf_reference.py).

  python3 tools/check_hf_export.py EXPORTED_FOLDER REFERENCE_SAFETENSORS [...pairs]

Prints the relative error of the logits for each pair and exits non-zero above 1e-5.
"""
import sys

import torch
import transformers
from safetensors.torch import load_file


def check(folder, reference):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    ref = load_file(reference)
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"]).logits.float()
    err = ((logits - ref["logits"]).norm() / ref["logits"].norm()).item()
    print(f"{folder}: {type(model).__name__}, logits relative error {err:.3e}")
    return err


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    worst = max(check(args[i], args[i + 1]) for i in range(0, len(args), 2))
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
