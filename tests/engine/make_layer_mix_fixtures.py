#!/usr/bin/env python3
"""Writes tests/engine/data/<name>/: tiny random bf16 checkpoints whose layers mix dense MLPs and
MoE blocks (qwen2_moe with mlp_only_layers, qwen3_moe with decoder_sparse_step = 2), plus
logits.safetensors with p{i}.ids (int32 [T]) and p{i}.logits (float32 [T, V]) computed by HF
transformers in float32 from the saved bf16 weights (reloaded from disk, eager attention).

Run with the project venv: .venv/bin/python tests/engine/make_layer_mix_fixtures.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
COMMON = dict(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
              tie_word_embeddings=False, eos_token_id=0, pad_token_id=0)
MODELS = {
    # Layer 1 is a dense MLP (mlp_only_layers), layers 0 and 2 are MoE with a shared expert.
    "qwen2_moe_mlp_only": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(
        intermediate_size=96, moe_intermediate_size=48, shared_expert_intermediate_size=80,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[1])),
    # decoder_sparse_step 2: layers 0 and 2 dense, layer 1 MoE; head_dim != hidden / heads.
    "qwen3_moe_sparse_step": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        head_dim=24, intermediate_size=96, moe_intermediate_size=48, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=2)),
}
PROMPT_LENGTHS = [1, 7, 33]


def Main():
    torch.manual_seed(20261129)
    for name, (cfg_cls, model_cls, extra) in MODELS.items():
        cfg = cfg_cls(**COMMON, **extra)
        model = model_cls(cfg)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.06)
        out_dir = os.path.join(OUT, name)
        model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
        for extra_file in ("generation_config.json",):
            path = os.path.join(out_dir, extra_file)
            if os.path.exists(path):
                os.remove(path)
        ref = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
        gen = torch.Generator().manual_seed(7)
        tensors = {}
        for i, n in enumerate(PROMPT_LENGTHS):
            ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
            with torch.no_grad():
                logits = ref(ids[None]).logits[0].float().contiguous()
            tensors[f"p{i}.ids"] = ids.to(torch.int32)
            tensors[f"p{i}.logits"] = logits
        save_file(tensors, os.path.join(out_dir, "logits.safetensors"))
        print(f"{name}: written to {out_dir}")


if __name__ == "__main__":
    Main()
