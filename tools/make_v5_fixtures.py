#!/usr/bin/env python3
"""Writes tests/fixtures/models_v5/: tiny random checkpoints saved by the installed transformers
(5.x), with the reference logits the engine's parity test (tests/engine/v5_checkpoint_test.cc)
compares against.

One directory per case, each with config.json and model.safetensors as save_pretrained wrote
them (generation_config.json removed, except where a case keeps it), and logits.safetensors:
p{i}.ids (int32 [T]) and p{i}.logits (float32 [T, V]) for prompts of 1, 5 and 40 ids.

Cases: each supported family as transformers 5 writes it (bf16; qwen3_moe and mixtral with
num_local_experts, every family with rope_parameters and dtype); an fp16 and an fp32
checkpoint; rope_parameters with rope_theta 1e6; and the RoPE scalings the engine implements
(yarn twice, one of them in the 4.x form rope_theta + rope_scaling written into config.json
by hand, linear, dynamic, llama3). Scaled cases have a short max_position_embeddings or
original context (16) so the 40-id prompt reaches past it (dynamic: max_position_embeddings
16, factor 4, so the engine's context, 16 x 4, takes the 40 ids).

References: HF transformers in float32 (eager attention). For bf16 checkpoints, from the
checkpoint's weights (an exact upcast). The engine stores weight matrices in bf16 and rounds
an fp16 or fp32 checkpoint's matrices to bf16 at load (norms and biases stay fp32), as
vLLM's --dtype bfloat16 does; for those checkpoints the reference is HF with the same
matrices rounded the same way (round to nearest even), and the script prints how far that
moves HF's logits from its own run of the unrounded checkpoint (tests/fixtures/README.md
records the figures).

Run: /path/to/venv/bin/python tools/make_v5_fixtures.py   (needs torch, transformers >= 5)
"""

import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "models_v5")
SEED = 20261204
PROMPT_LENGTHS = [1, 5, 40]

sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_fixtures import ForwardWithMargins, RandomizeWeights, SaveTensors  # noqa: E402


def Common(max_pos=64, theta=None):
    c = dict(vocab_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=max_pos, rms_norm_eps=1e-6, bos_token_id=None,
             eos_token_id=0, pad_token_id=0)
    if theta is not None:
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    return c


def Family(model_type, rope=None, max_pos=64):
    """A tiny config of `model_type`, shapes varied as in make_fixtures.py's."""
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = Common(max_pos)
    if rope is not None:
        common["rope_parameters"] = rope
    if model_type == "qwen2_moe":
        return Qwen2MoeConfig(
            hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
            shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=False, qkv_bias=True, decoder_sparse_step=1, mlp_only_layers=[],
            use_sliding_window=False, tie_word_embeddings=True, **common)
    if model_type == "qwen3_moe":
        return Qwen3MoeConfig(
            hidden_size=32, head_dim=16, intermediate_size=48, moe_intermediate_size=16,
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], use_sliding_window=False, attention_bias=False,
            tie_word_embeddings=False, **common)
    if model_type == "olmoe":
        return OlmoeConfig(
            hidden_size=32, intermediate_size=16, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=False, clip_qkv=None, attention_bias=False,
            tie_word_embeddings=False, **common)
    if model_type == "mixtral":
        return MixtralConfig(
            hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None, tie_word_embeddings=True, **common)
    raise ValueError(model_type)


def Cases():
    """name -> (config, save dtype, config.json edit or None)."""
    import torch

    def Theta(theta):
        return {"rope_type": "default", "rope_theta": theta}

    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 16}

    def V4Yarn(cfg):
        # transformers 4.x wrote rope_theta at the top and the scaling as rope_scaling {type}.
        rp = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rp["rope_theta"]
        cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 16,
                               "beta_fast": 16, "beta_slow": 2}
        cfg["torch_dtype"] = cfg.pop("dtype")
        cfg.pop("head_dim", None)
        return cfg

    return {
        # rope_theta other than the family's default, so a reader that misses
        # rope_parameters.rope_theta gives other logits.
        "qwen2_moe": (Family("qwen2_moe", Theta(1e6)), torch.bfloat16, None),
        "qwen3_moe": (Family("qwen3_moe", Theta(1e6)), torch.bfloat16, None),
        "olmoe": (Family("olmoe", Theta(5e5)), torch.bfloat16, None),
        "mixtral": (Family("mixtral", Theta(1e4)), torch.bfloat16, None),
        "qwen2_moe_fp16": (Family("qwen2_moe"), torch.float16, None),
        "qwen3_moe_fp32": (Family("qwen3_moe"), torch.float32, None),
        "olmoe_theta_1e6": (Family("olmoe", {"rope_type": "default", "rope_theta": 1e6}),
                            torch.bfloat16, None),
        "qwen3_moe_yarn": (Family("qwen3_moe", yarn), torch.bfloat16, None),
        "qwen2_moe_yarn_v4": (Family("qwen2_moe", {"rope_type": "default", "rope_theta": 1e6}),
                              torch.bfloat16, V4Yarn),
        "mixtral_linear": (Family("mixtral", {"rope_type": "linear", "rope_theta": 1e6,
                                              "factor": 4.0}), torch.bfloat16, None),
        "olmoe_dynamic": (Family("olmoe", {"rope_type": "dynamic", "rope_theta": 10000.0,
                                           "factor": 4.0}, max_pos=16), torch.bfloat16, None),
        "qwen2_moe_llama3": (Family("qwen2_moe", {"rope_type": "llama3", "rope_theta": 10000.0,
                                                  "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 16}),
                             torch.bfloat16, None),
    }


def LoadReference(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def RoundMatricesToBf16(model):
    """A copy of `model` (fp32) whose matrices (every parameter of 2+ dims: embeddings,
    projections, router, experts, lm_head) are rounded to bf16 as the engine stores them."""
    import copy
    import torch

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() >= 2:
                p.copy_(p.to(torch.bfloat16).float())
    return rounded


def MaxShift(a_model, b_model, prompts):
    worst = 0.0
    for ids in prompts:
        a, _, _ = ForwardWithMargins(a_model, ids)
        b, _, _ = ForwardWithMargins(b_model, ids)
        worst = max(worst, (a - b).abs().max().item())
    return worst


def Write(name, config, dtype, edit, index):
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = os.path.join(OUT, name)
    for attempt in range(20):
        seed = SEED + 100 * index + attempt
        shutil.rmtree(out_dir, ignore_errors=True)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        RandomizeWeights(model, seed)
        model = model.to(dtype)
        model.config.output_router_logits = False
        model.save_pretrained(out_dir)
        gen_cfg = os.path.join(out_dir, "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
        if edit is not None:
            path = os.path.join(out_dir, "config.json")
            with open(path) as f:
                cfg = json.load(f)
            with open(path, "w") as f:
                json.dump(edit(cfg), f, indent=2, sort_keys=True)
                f.write("\n")
        native = LoadReference(out_dir)
        ref = native if dtype == torch.bfloat16 else RoundMatricesToBf16(native)
        gen = torch.Generator().manual_seed(seed)
        tensors, prompts = {}, []
        worst_router, worst_logit = float("inf"), float("inf")
        for i, length in enumerate(PROMPT_LENGTHS):
            ids = torch.randint(3, config.vocab_size, (length,), generator=gen).tolist()
            prompts.append(ids)
            logits, rm, lm = ForwardWithMargins(ref, ids)
            worst_router, worst_logit = min(worst_router, rm), min(worst_logit, lm)
            tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"p{i}.logits"] = logits
        if worst_router > 1e-4 and worst_logit > 1e-3:
            break
        print(f"{name}: seed {seed} has a near tie (router {worst_router:.2e}, "
              f"logit {worst_logit:.2e}); trying the next seed")
    else:
        raise SystemExit(f"{name}: no seed without near ties")
    SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
    note = ""
    if dtype != torch.bfloat16:
        note = f", bf16 rounding moves HF's logits by {MaxShift(native, ref, prompts):.2e}"
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: seed {seed}, {size} bytes, min router margin {worst_router:.3e}, "
          f"min top-1 logit margin {worst_logit:.3e}{note}")


def Main():
    import torch
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise SystemExit(f"transformers {transformers.__version__}: these fixtures need >= 5")
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    for index, (name, (config, dtype, edit)) in enumerate(Cases().items()):
        Write(name, config, dtype, edit, index)


if __name__ == "__main__":
    Main()
