#!/usr/bin/env python3
"""Writes the Hugging Face reference files that shardtrain's CPU tests compare against.

For each tiny random Llama-architecture model below it saves, in OUT/<case>/:
  config.json, model.safetensors   the model, via save_pretrained (f32)
  reference.safetensors            input_ids [B,T] (i64), targets [B,T] (i64: labels shifted
                                   left, -100 = ignored), logits [B,T,V], loss [] (mean over
                                   counted tokens), grad.<name> for every parameter, and
                                   adamw.<name>: every parameter after one torch.optim.AdamW
                                   step (lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight decay
                                   0.1 on every parameter); for cases with room for it, the
                                   greedy.* continuation (see GREEDY_PROMPT)
All computation is f32 on the CPU with eager attention.

Regenerate (where torch and transformers are installed):
  python3 tools/make_hf_reference.py --out tests/model/hf_reference
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import save_file

# Cases whose max_position_embeddings reach this also record a greedy continuation: the first
# GREEDY_PROMPT ids of a random prompt continued by GREEDY_NEW ids with transformers' generate
# (f32, no sampling, no end-of-sequence id).
GREEDY_PROMPT, GREEDY_NEW = 200, 32
GREEDY_POSITIONS = 256

CASES = {
    # name: (config overrides, architecture)
    "gqa_untied": (dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), "llama"),
    "mha_tied": (dict(num_attention_heads=3, num_key_value_heads=3, tie_word_embeddings=True), "llama"),
    "gqa4_llama3_rope": (
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
        "llama",
    ),
    "qwen2_bias": (dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), "qwen2"),
    "mistral_gqa": (dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), "mistral"),
    # A head_dim of its own, as Mistral-Nemo's: 4 heads of 32 (attention 128 wide) in a width of
    # 64. Its head dim is a multiple of 8, so the GPU tests compare against it too.
    "mistral_head_dim": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
             tie_word_embeddings=False, max_position_embeddings=GREEDY_POSITIONS),
        "mistral",
    ),
    # Qwen3: QK-norm (an RMSNorm over each head's q and k before rope) with a head_dim of its own
    # and a tied head, as Qwen3-0.6B to 4B ship.
    "qwen3_qk_norm": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
             tie_word_embeddings=True, max_position_embeddings=GREEDY_POSITIONS),
        "qwen3",
    ),
    # SmolLM3: NoPE layers (no_rope_layers: 1 = the layer uses rope, 0 = it does not), here
    # the second and fourth of four, and a tied head as SmolLM3-3B ships.
    "smollm3_nope": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, num_hidden_layers=4,
             no_rope_layers=[1, 0, 1, 0], tie_word_embeddings=True, max_position_embeddings=GREEDY_POSITIONS),
        "smollm3",
    ),
    # Granite 3: the embeddings, each sublayer's output, the attention scores and the logits
    # scaled (floats: transformers 5's GraniteConfig checks their type). logits_scaling a power
    # of two, as Granite 3 ships (8, 16).
    "granite_scaled": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625, logits_scaling=4.0,
             tie_word_embeddings=True, max_position_embeddings=GREEDY_POSITIONS),
        "granite",
    ),
    # OLMo 2: RMSNorms after the attention and the MLP (no input norms), and QK-norm over the
    # whole q and k projections before rope.
    "olmo2_post_norms": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             tie_word_embeddings=False, max_position_embeddings=GREEDY_POSITIONS),
        "olmo2",
    ),
    # Gemma 3's text model: (1 + w) norms before and after each sublayer, per-head QK-norm, GeGLU
    # (gelu_pytorch_tanh), embeddings x sqrt(48) (not a power of two), a softmax scale of
    # query_pre_attn_scalar^-0.5 (24, not the head dim), heads of 16 (64 wide in a width of 48),
    # layers 0 and 2 sliding (4 positions) with their own rope base, layers 1 and 3 full with
    # linear rope scaling, and a tied head. layer_types for transformers 4.53 and later,
    # sliding_window_pattern (the same layers) for the earlier 4.5x.
    "gemma3_text_small": (
        dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
             num_hidden_layers=4, query_pre_attn_scalar=24, sliding_window=4, sliding_window_pattern=2,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             rope_theta=10000.0, rope_local_base_freq=100.0, rope_scaling=dict(rope_type="linear", factor=2.0),
             tie_word_embeddings=True, max_position_embeddings=GREEDY_POSITIONS),
        "gemma3_text",
    ),
    # Gemma 2: Gemma 3's norms, GeGLU and scaled embeddings without QK-norm, one rope, the even
    # layers sliding (4 positions), and the attention scores and logits soft-capped (at 2 and 3
    # here, inside tanh's curve for these weights). The CPU tests only: the GPU refuses soft-capping.
    "gemma2_softcap": (
        dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
             num_hidden_layers=4, query_pre_attn_scalar=24, sliding_window=4,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             attn_logit_softcapping=2.0, final_logit_softcapping=3.0, tie_word_embeddings=False,
             max_position_embeddings=GREEDY_POSITIONS),
        "gemma2",
    ),
    # Phi-3: q, k and v in one qkv_proj tensor and gate and up in one gate_up_proj, LongRoPE
    # (short factors up to original_max_position_embeddings = 16 positions, so the 13-token rows
    # use them; long factors past it, so the greedy continuation does; cos and sin scaled by
    # sqrt(1 + ln(256 / 16) / ln 16)), Phi-3-mini's fixed sliding window (5 positions here).
    "phi3_longrope": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             tie_word_embeddings=False, sliding_window=5, original_max_position_embeddings=16,
             rope_scaling=dict(type="longrope", short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                               long_factor=[1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 9.0, 12.0]),
             max_position_embeddings=GREEDY_POSITIONS),
        "phi3",
    ),
    # Phi-4-mini: rope on the first three quarters of each head (partial_rotary_factor 0.75: 12
    # of 16 dimensions, the rest passed through), LongRoPE over those 12, a tied head, no window.
    "phi4_partial_rotary": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             tie_word_embeddings=True, partial_rotary_factor=0.75, original_max_position_embeddings=16,
             rope_scaling=dict(type="longrope", short_factor=[1.0, 1.2, 1.5, 2.0, 2.7, 3.5],
                               long_factor=[1.0, 2.0, 3.0, 5.0, 8.0, 13.0]),
             max_position_embeddings=GREEDY_POSITIONS),
        "phi3",
    ),
    # Sliding-window attention: Mistral v0.1's window on every layer (5 positions, under the
    # 13-token rows and the 200-id greedy prompt), and Qwen2's window on the layers from
    # max_window_layers on (here the second of two).
    "mistral_sliding": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             tie_word_embeddings=False, sliding_window=5, max_position_embeddings=GREEDY_POSITIONS),
        "mistral",
    ),
    # Ministral: Mistral with layer types, here a sliding first layer (window 5) and a full second
    "ministral_layers": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
             tie_word_embeddings=False, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
             max_position_embeddings=GREEDY_POSITIONS),
        "ministral",
    ),
    "qwen2_window_layers": (
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             tie_word_embeddings=False, use_sliding_window=True, sliding_window=4, max_window_layers=1,
             max_position_embeddings=GREEDY_POSITIONS),
        "qwen2",
    ),
    # Head dims cuDNN's fused attention takes (a multiple of 8): the GPU tests' references.
    "gpu_h64_gqa": (
        dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=192, vocab_size=96,
             tie_word_embeddings=False),
        "llama",
    ),
    "gpu_h128_tied_llama3": (
        dict(
            hidden_size=256,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=160,
            vocab_size=96,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
        "llama",
    ),
}

BATCH, SEQ = 2, 13


def build(overrides, arch):
    common = dict(
        vocab_size=67,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        attention_dropout=0.0,
    )
    common.update(overrides)
    if arch == "mistral":
        common.pop("rope_scaling", None)
        config = transformers.MistralConfig(sliding_window=common.pop("sliding_window", None), **common)
        model = transformers.MistralForCausalLM(config)
    elif arch == "ministral":
        common.pop("rope_scaling", None)
        config = transformers.MinistralConfig(**common)
        model = transformers.MinistralForCausalLM(config)
    elif arch == "qwen3":
        common.pop("rope_scaling", None)
        config = transformers.Qwen3Config(use_sliding_window=False, attention_bias=False, **common)
        model = transformers.Qwen3ForCausalLM(config)
    elif arch == "smollm3":
        common.pop("rope_scaling", None)
        # no padding row: SmolLM3's default pad id (128004) lies outside these vocabularies, and
        # a padding row would get no gradient
        config = transformers.SmolLM3Config(use_sliding_window=False, attention_bias=False, mlp_bias=False,
                                            pad_token_id=None, bos_token_id=None, eos_token_id=None, **common)
        model = transformers.SmolLM3ForCausalLM(config)
    elif arch == "granite":
        common.pop("rope_scaling", None)
        config = transformers.GraniteConfig(attention_bias=False, mlp_bias=False, **common)
        model = transformers.GraniteForCausalLM(config)
    elif arch == "olmo2":
        common.pop("rope_scaling", None)
        # no padding row (OLMo 2's default pad id is 1): its embedding row would get no gradient
        config = transformers.Olmo2Config(attention_bias=False, pad_token_id=None, eos_token_id=None, **common)
        model = transformers.Olmo2ForCausalLM(config)
    elif arch == "gemma3_text":
        common.pop("hidden_act")  # Gemma reads hidden_activation
        # no padding row (Gemma's default pad id is 0): its embedding row would get no gradient
        config = transformers.Gemma3TextConfig(hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                                               attn_logit_softcapping=None, final_logit_softcapping=None,
                                               pad_token_id=None, bos_token_id=None, eos_token_id=None, **common)
        model = transformers.Gemma3ForCausalLM(config)
    elif arch == "gemma2":
        common.pop("hidden_act")  # Gemma reads hidden_activation
        common.pop("rope_scaling", None)
        # no padding row (Gemma's default pad id is 0): its embedding row would get no gradient
        config = transformers.Gemma2Config(hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                                           pad_token_id=None, bos_token_id=None, eos_token_id=None, **common)
        model = transformers.Gemma2ForCausalLM(config)
    elif arch == "phi3":
        # no padding row (Phi-3's default pad id, 32000, lies outside these vocabularies)
        config = transformers.Phi3Config(resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=None, bos_token_id=None,
                                         eos_token_id=None, **common)
        model = transformers.Phi3ForCausalLM(config)
    elif arch == "qwen2":
        common.pop("rope_scaling", None)
        config = transformers.Qwen2Config(use_sliding_window=common.pop("use_sliding_window", False), **common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        model = transformers.LlamaForCausalLM(config)
    return model


def randomize(model, generator):
    # Every parameter random with a nonzero mean: no gradient is trivially zero. Models wider
    # than the first cases' 24 scale their matrices by sqrt(24 / fan-in), so activations and
    # attention scores stay in the same range (the first cases predate the scaling).
    # Gemma's norms scale by 1 + weight: their weights random around 0 give the same scales.
    wide = model.config.hidden_size > 24
    norm_offset = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(norm_offset + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.05 + 0.1 * noise)
            else:
                scale = (24.0 / p.shape[-1]) ** 0.5 if wide and "embed_tokens" not in name else 1.0
                p.copy_(scale * (0.01 + 0.15 * noise))


def make_case(name, overrides, arch, out_dir):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1234 + len(name))
    model = build(overrides, arch).float()
    model.config._attn_implementation = "eager"
    randomize(model, generator)
    model.train()

    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)

    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (BATCH, SEQ), generator=generator)
    labels = input_ids.clone()
    labels[0, 5] = -100
    labels[1, 9] = -100
    targets = torch.full_like(labels, -100)
    targets[:, :-1] = labels[:, 1:]

    if model.config.max_position_embeddings >= GREEDY_POSITIONS:
        prompt = torch.randint(0, vocab, (1, GREEDY_PROMPT), generator=generator)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            full = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=GREEDY_NEW, min_new_tokens=GREEDY_NEW)
            # the smallest gap between the picked logit and the next one, over the new ids: how
            # far another engine's rounding is from flipping a pick
            logits = model(input_ids=full[:, :-1]).logits[0, GREEDY_PROMPT - 1:].float()
        top2 = logits.topk(2, dim=-1).values
        greedy = {
            "greedy.prompt": prompt[0].contiguous(),
            "greedy.continuation": full[0, GREEDY_PROMPT:].contiguous(),
            "greedy.margin": (top2[:, 0] - top2[:, 1]).min().reshape(()),
        }
        assert greedy["greedy.continuation"].numel() == GREEDY_NEW
    else:
        greedy = {}

    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    record = {
        "input_ids": input_ids.contiguous(),
        "targets": targets.contiguous(),
        "logits": out.logits.detach().float().contiguous(),
        "loss": out.loss.detach().float().reshape(()),
        **greedy,
    }
    params = dict(model.named_parameters())
    for pname, p in params.items():
        record["grad." + pname] = p.grad.detach().clone().contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.step()
    for pname, p in params.items():
        record["adamw." + pname] = p.detach().clone().contiguous()
    save_file(record, os.path.join(case_dir, "reference.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    print(f"{name}: loss {out.loss.item():.6f}, {sum(p.numel() for p in params.values())} parameters")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("cases", nargs="*", help="cases to write (default: all)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    for name, (overrides, arch) in CASES.items():
        if not args.cases or name in args.cases:
            make_case(name, overrides, arch, args.out)


if __name__ == "__main__":
    main()
