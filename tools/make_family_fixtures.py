#!/usr/bin/env python3
"""Writes the reference fixtures of the families added after tools/make_fixtures.py's four,
from HF transformers >= 5 (run in a venv with torch and transformers 5):

  tests/fixtures/models/glm4_moe/          GLM-4.5-style: 3 layers, the first dense
                                           (first_k_dense_replace 1), 16 routed experts top-4 in
                                           one group, one shared expert, q/k/v bias, partial
                                           rotary 0.5, norm_topk_prob, routed_scaling_factor 2.5,
                                           and MTP tensors (model.layers.3.*) the engine ignores.
  tests/fixtures/models/glm4_moe_grouped/  grouped top-k (n_group 4, topk_group 2), two shared
                                           experts (width 2 x moe_intermediate_size), qk norm,
                                           no attention bias, norm_topk_prob false,
                                           head_dim * heads != hidden.
  tests/fixtures/models/qwen3_next/        Qwen3-Next-style hybrid: 4 layers, Gated DeltaNet
                                           linear attention and full attention alternating
                                           (full_attention_interval 2), grouped linear heads
                                           (2 key heads, 4 value heads, key dim 16, value dim
                                           8), output-gated attention with partial rotary 0.25,
                                           16 experts top-4 plus a sigmoid-gated shared expert,
                                           a dense layer (mlp_only_layers [2]); prompts of 1, 5,
                                           70 and 150 ids, longer than the delta rule's chunk
                                           (64), so HF's chunked form runs over several chunks.
  tests/fixtures/models/qwen3_5_moe/       Qwen3.5-MoE's multimodal checkpoint (model_type
                                           qwen3_5_moe, text_config qwen3_5_moe_text): the
                                           same hybrid text stack with split linear input
                                           projections, M-RoPE sections in rope_parameters, a
                                           one-block vision tower the engine skips; prompts as
                                           qwen3_next's, text only.
  tests/fixtures/models/gpt_oss/           gpt-oss-style: 3 layers alternating sliding-window
                                           (window 8, shorter than the 40-id prompt) and full
                                           attention, per-head sinks, q/k/v/o bias, YaRN RoPE
                                           (factor 32 over 64 positions, truncate false), 16
                                           experts top-4 with router bias, expert biases,
                                           gate/up interleaved in one stacked tensor, the
                                           clamped SwiGLU (alpha 1.702, limit 7).
  tests/fixtures/models/gpt_oss_mxfp4/     the same model with its experts in MXFP4 as the
                                           released gpt-oss checkpoints store them
                                           (*_blocks, *_scales; quantization_config mxfp4),
                                           quantized here in numpy; references from transformers
                                           loading that checkpoint (dequantized on the CPU).
  tests/fixtures/models/gemma4/            Gemma-4-style text stack with enable_moe_block: 4
                                           layers sliding (window 8, shorter than the 40-id
                                           prompt) / full, per-layer-type RoPE (default 10000;
                                           proportional 0.25 at 1e6), attention_k_eq_v, q/k
                                           norms and the unscaled v norm, a dense gelu-tanh MLP
                                           beside 16 stacked experts top-4 in every layer, the
                                           router's scale and per-expert scale, layer scalars,
                                           scaled tied embeddings, final_logit_softcapping 30.
  tests/fixtures/models/gemma4_global/     gemma4's stack with full layers of their own KV shape,
                                           as Gemma-4-26B-A4B's: global_head_dim 32 against
                                           head_dim 16 and num_global_key_value_heads 1 against
                                           num_key_value_heads 4 (so a full layer's K/V are half
                                           a sliding layer's), the full layers' proportional
                                           RoPE over their 32 dims; config.json in the released
                                           layout (global_head_dim and num_global_key_value_heads,
                                           no per_layer_config) with use_bidirectional_attention
                                           "vision", as the released checkpoint has them.
  tests/fixtures/models/gemma4_mm/         the same language model inside Gemma-4's multimodal
                                           checkpoint (Gemma4ForConditionalGeneration, model_type
                                           gemma4: tensors under model.language_model.) with a
                                           one-layer vision tower the engine skips; references
                                           from transformers running the wrapper on text.
  tests/fixtures/models/deepseek_v3/       DeepSeek-V3-style: 3 layers, the first dense, MLA with
                                           q_lora_rank 24, kv_lora_rank 32, qk_nope 16, qk_rope 8,
                                           v_head_dim 12, interleaved RoPE, YaRN (factor 4 over
                                           128 positions, mscale = mscale_all_dim = 1, so the
                                           softmax scale carries mscale^2), 16 experts top-4 in
                                           n_group 4 / topk_group 2, one shared expert,
                                           routed_scaling_factor 2.5, an MTP layer's tensors.
  tests/fixtures/models/deepseek_v3_direct/ q_proj without q_lora, rotate-half RoPE
                                           (rope_interleave false), default RoPE, one group,
                                           two shared experts, norm_topk_prob false.
  tests/fixtures/models/kimi_k2/           Kimi-K2-style: model_type kimi_k2 with architecture
                                           DeepseekV3ForCausalLM, 32 experts top-8 in one group,
                                           routed_scaling_factor 2.827, YaRN factor 32; the
                                           references are transformers' run of the same
                                           checkpoint as deepseek_v3 (it has no kimi_k2 type).
  tests/fixtures/models/deepseek_v3_fp8/   hidden 192 and FFN 160 (blocks of 128 cut partial
                                           edges), every linear weight but the router, the
                                           embeddings and lm_head stored float8_e4m3fn with
                                           weight_scale_inv per 128x128 block (amax / 448, as
                                           DeepSeek quantizes), quantization_config fp8;
                                           references from transformers on the checkpoint as
                                           DeepSeek's fp8_cast_bf16 converts it (CastFp8ToBf16
                                           says why not transformers' own FP8 loader).

Each holds config.json (in the released GLM-4.5 layout: rope_theta and partial_rotary_factor at
the top level; qwen3_next as transformers writes it), model.safetensors (bf16, e_score_correction_bias random so that it moves the
selection) and logits.safetensors (p{i}.ids int32 [T], p{i}.logits float32 [T, V] for prompts
of 1, 5 and 40 ids, as tests/fixtures/README.md describes; and g{i}.ids / g{i}.out, int32, the
greedy continuation of GREEDY_NEW_TOKENS ids after p{i}.ids: argmax of the logits, full
recompute each step). References are HF's, in float32
from the bf16 weights, eager attention. Seeds are tried in a fixed order until no decision is
near a tie: the gap between a token's k-th and (k+1)-th selection score (sigmoid + bias, inside
its kept groups), between its topk_group-th and next group score, and between the top two
logits.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

SEED = 20261204
MTP_LAYERS = 1
GREEDY_NEW_TOKENS = 12
GPT_OSS_WINDOW = 8


def DeepseekConfigs():
    from transformers import DeepseekV3Config

    common = dict(vocab_size=2048, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=512, rms_norm_eps=1e-6,
                  intermediate_size=96, moe_intermediate_size=32, first_k_dense_replace=1,
                  num_nextn_predict_layers=MTP_LAYERS, kv_lora_rank=32, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=12, hidden_act="silu",
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                mscale=1.0, mscale_all_dim=1.0, original_max_position_embeddings=128)
    return {
        "deepseek_v3": DeepseekV3Config(
            hidden_size=64, q_lora_rank=24, n_routed_experts=16, num_experts_per_tok=4,
            n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_interleave=True, rope_parameters=yarn, **common),
        "deepseek_v3_direct": DeepseekV3Config(
            hidden_size=64, q_lora_rank=None, n_routed_experts=16, num_experts_per_tok=4,
            n_group=1, topk_group=1, n_shared_experts=2, routed_scaling_factor=1.0,
            norm_topk_prob=False, rope_interleave=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0), **common),
        "kimi_k2": DeepseekV3Config(
            hidden_size=64, q_lora_rank=24, n_routed_experts=32, num_experts_per_tok=8,
            n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.827,
            norm_topk_prob=True, rope_interleave=True,
            rope_parameters=dict(yarn, factor=32.0, original_max_position_embeddings=16),
            **common),
        "deepseek_v3_fp8": DeepseekV3Config(
            hidden_size=192, q_lora_rank=24, n_routed_experts=16, num_experts_per_tok=4,
            n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_interleave=True, rope_parameters=yarn,
            **dict(common, intermediate_size=160)),
    }


def Configs():
    from transformers import Glm4MoeConfig, Qwen3NextConfig, Qwen3_5MoeConfig

    common = dict(vocab_size=4096, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                  rope_theta=10000.0, partial_rotary_factor=0.5, intermediate_size=96,
                  moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                  first_k_dense_replace=1, num_nextn_predict_layers=MTP_LAYERS,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    return {
        "glm4_moe": Glm4MoeConfig(
            hidden_size=64, head_dim=16, n_group=1, topk_group=1, n_shared_experts=1,
            attention_bias=True, use_qk_norm=False, norm_topk_prob=True,
            routed_scaling_factor=2.5, **common),
        "glm4_moe_grouped": Glm4MoeConfig(
            hidden_size=48, head_dim=16, n_group=4, topk_group=2, n_shared_experts=2,
            attention_bias=False, use_qk_norm=True, norm_topk_prob=False,
            routed_scaling_factor=1.0, **common),
        "qwen3_next": Qwen3NextConfig(
            vocab_size=1024, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, full_attention_interval=2,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=16,
            num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            intermediate_size=96, mlp_only_layers=[2], norm_topk_prob=True,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=0, pad_token_id=0),
        "qwen3_5_moe": Qwen3_5MoeConfig(
            text_config=dict(
                vocab_size=1024, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, full_attention_interval=2,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=16,
                num_experts_per_tok=4, moe_intermediate_size=32,
                shared_expert_intermediate_size=48, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                eos_token_id=0, pad_token_id=0,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                     mrope_interleaved=True)),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                               temporal_patch_size=2),
            tie_word_embeddings=False),
    }


# Prompt lengths per fixture: the linear-attention families' reach past the delta rule's chunk.
PROMPT_LENGTHS = {"qwen3_next": [1, 5, 70, 150], "qwen3_5_moe": [1, 5, 70, 150]}


def ModelClass(config):
    """The class HF runs the fixture with: the multimodal wrapper's own for qwen3_5_moe
    (served text-only by the engine), else the causal-LM auto class."""
    from transformers import AutoModelForCausalLM, Qwen3_5MoeForConditionalGeneration

    if config.model_type == "qwen3_5_moe":
        return Qwen3_5MoeForConditionalGeneration
    return AutoModelForCausalLM


def LoadReference(out_dir, config):
    import torch

    if config.model_type != "qwen3_5_moe":
        return mf.LoadReference(out_dir)
    model = ModelClass(config).from_pretrained(out_dir, dtype=torch.float32,
                                               attn_implementation="eager")
    model.eval()
    return model


def Randomize(model, seed):
    """make_fixtures.RandomizeWeights, then e_score_correction_bias (a buffer) N(0, 0.2^2): of
    the order of the sigmoid scores' spread, so the bias changes which experts are selected."""
    import torch

    mf.RandomizeWeights(model, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def ReleaseLayout(out_dir):
    """Rewrites config.json as the released GLM-4.5 checkpoints have it (rope_theta and
    partial_rotary_factor at the top level, rope_scaling null) and drops generation_config."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp["rope_theta"]
    c["partial_rotary_factor"] = rp["partial_rotary_factor"]
    c["rope_scaling"] = None
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    gen_cfg = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)


def AddMtpTensors(out_dir, config, seed):
    """Appends an MTP module's tensors (layer index num_hidden_layers, as GLM-4.5 ships them:
    eh_proj, enorm, hnorm, shared_head.norm, and a decoder layer's attention) to
    model.safetensors. transformers ignores them; so must the engine."""
    import torch
    from safetensors.torch import load_file

    path = os.path.join(out_dir, "model.safetensors")
    t = load_file(path)
    gen = torch.Generator().manual_seed(seed + 11)
    h = config.hidden_size
    p = f"model.layers.{config.num_hidden_layers}."
    for name, shape in [("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)),
                        ("hnorm.weight", (h,)), ("shared_head.norm.weight", (h,)),
                        ("input_layernorm.weight", (h,)),
                        ("self_attn.q_proj.weight", (config.num_attention_heads * config.head_dim, h))]:
        t[p + name] = (0.1 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    mf.SaveTensors(path, t)


def SelectionMargins(model, router_logits):
    """Smallest (k-th minus (k+1)-th selection score inside the kept groups, topk_group-th
    minus next group score) over the tokens of every MoE layer."""
    import torch

    cfg = model.config
    k, G, TG = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    E = cfg.n_routed_experts
    gates = [l.mlp.gate for l in model.model.layers if hasattr(l.mlp, "gate")]
    assert len(gates) == len(router_logits)
    sel_margin, group_margin = float("inf"), float("inf")
    for gate, rl in zip(gates, router_logits):
        s = rl.float().sigmoid() + gate.e_score_correction_bias.float()
        gs = s.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
        if G > TG:
            top = gs.topk(TG + 1, dim=-1).values
            group_margin = min(group_margin, (top[:, TG - 1] - top[:, TG]).min().item())
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(TG, dim=-1).indices, 1.0)
        mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
        s = s.masked_fill(~mask, float("-inf"))
        top = s.topk(k + 1, dim=-1).values
        gap = top[:, k - 1] - top[:, k]
        sel_margin = min(sel_margin, gap[torch.isfinite(gap)].min().item() if
                         torch.isfinite(gap).any() else float("inf"))
    return sel_margin, group_margin


def SoftmaxMargins(model, router_logits):
    """Smallest gap between the k-th and (k+1)-th router logit (softmax is monotone), and no
    group margin (inf): softmax top-k families."""
    k = model.config.num_experts_per_tok
    sel = float("inf")
    for rl in router_logits:
        top = rl.float().topk(k + 1, dim=-1).values
        sel = min(sel, (top[:, k - 1] - top[:, k]).min().item())
    return sel, float("inf")


def Forward(model, ids):
    import torch

    if model.config.model_type == "qwen3_5_moe":
        model.config.output_router_logits = True
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_router_logits=True,
                    use_cache=False)
    logits = out.logits[0].float()
    if model.config.model_type == "glm4_moe":
        sel, grp = SelectionMargins(model, out.router_logits)
    elif model.config.model_type == "qwen3_5_moe":
        k = model.config.text_config.num_experts_per_tok
        sel = min((rl.float().topk(k + 1, dim=-1).values[:, k - 1] -
                   rl.float().topk(k + 1, dim=-1).values[:, k]).min().item()
                  for rl in out.router_logits)
        grp = float("inf")
    else:
        sel, grp = SoftmaxMargins(model, out.router_logits)
    top2 = torch.topk(logits, 2, dim=-1).values
    return logits, sel, grp, (top2[:, 0] - top2[:, 1]).min().item()


def GptOssConfig():
    from transformers import GptOssConfig as Config

    return Config(vocab_size=1024, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=16, num_experts_per_tok=4, sliding_window=GPT_OSS_WINDOW,
                  max_position_embeddings=64 * 32, rms_norm_eps=1e-5,
                  rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                       beta_fast=32.0, beta_slow=1.0, truncate=False,
                                       original_max_position_embeddings=64),
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=0,
                  pad_token_id=0)


def GptOssForward(model, ids):
    """Logits, the smallest gap between a token's k-th and (k+1)-th router logit (the
    router ranks by them), and the smallest top-1 logit margin."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_router_logits=True,
                    use_cache=False)
    logits = out.logits[0].float()
    k = model.config.num_experts_per_tok
    sel = float("inf")
    for rl in out.router_logits:
        top = rl.float().topk(k + 1, dim=-1).values
        sel = min(sel, (top[:, k - 1] - top[:, k]).min().item())
    top2 = torch.topk(logits, 2, dim=-1).values
    return logits, sel, (top2[:, 0] - top2[:, 1]).min().item()


def WriteGptOss():
    """tests/fixtures/models/gpt_oss: bf16 weights (make_fixtures.RandomizeWeights, the sinks
    N(0, 1) so that the extra softmax column matters), HF's float32 logits and greedy
    continuations, as for the other families."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    config = GptOssConfig()
    out_dir = os.path.join(mf.FIXTURES, "models", "gpt_oss")
    os.makedirs(out_dir, exist_ok=True)
    for attempt in range(20):
        seed = SEED + 1000 + attempt
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        mf.RandomizeWeights(model, seed)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(seed + 3)
            for layer in model.model.layers:
                s = layer.self_attn.sinks
                s.copy_(torch.randn(s.shape, generator=gen, dtype=torch.float32))
        model = model.to(torch.bfloat16)
        model.save_pretrained(out_dir)
        gen_cfg = os.path.join(out_dir, "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
        ref = mf.LoadReference(out_dir)
        gen = torch.Generator().manual_seed(seed)
        tensors = {}
        worst = [float("inf")] * 2
        for i, length in enumerate(mf.RANDOM_PROMPT_LENGTHS):
            ids = torch.randint(3, config.vocab_size, (length,), generator=gen).tolist()
            logits, sel, lm = GptOssForward(ref, ids)
            worst = [min(worst[0], sel), min(worst[1], lm)]
            tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"p{i}.logits"] = logits
            seq = list(ids)
            for _ in range(GREEDY_NEW_TOKENS):
                step, sel, lm = GptOssForward(ref, seq)
                worst = [min(worst[0], sel), min(worst[1], lm)]
                seq.append(int(torch.argmax(step[-1])))
            tensors[f"g{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
        if worst[0] > 1e-3 and worst[1] > 1e-3:
            break
        print(f"gpt_oss: seed {seed} has a near tie (router {worst[0]:.2e}, logit "
              f"{worst[1]:.2e}); trying the next seed")
    else:
        raise SystemExit("gpt_oss: no seed without near ties")
    mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    print(f"gpt_oss: seed {seed}, model.safetensors {size} bytes, min router logit margin "
          f"{worst[0]:.3e}, min top-1 logit margin {worst[1]:.3e}")


GEMMA4_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention",
                      "full_attention"]


def Gemma4TextConfig(**changes):
    from transformers import Gemma4TextConfig as Config

    fields = dict(vocab_size=1024, hidden_size=64, intermediate_size=48, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=16,
                  sliding_window=GPT_OSS_WINDOW, layer_types=list(GEMMA4_LAYER_TYPES),
                  hidden_size_per_layer_input=0, attention_k_eq_v=True, enable_moe_block=True,
                  num_experts=16, top_k_experts=4, moe_intermediate_size=32,
                  final_logit_softcapping=30.0, max_position_embeddings=512, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    fields.update(changes)
    return Config(**fields)


# gemma4_global: the full layers' own shape (Gemma-4-26B-A4B: 8 kv heads x 256 on sliding
# layers, 2 x 512 on full ones), here 4 x 16 against 1 x 32.
GEMMA4_GLOBAL = dict(num_key_value_heads=4, global_head_dim=32, num_global_key_value_heads=1,
                     use_bidirectional_attention="vision")


def Gemma4ReleaseLayout(out_dir):
    """Rewrites config.json as the released Gemma-4 checkpoints have it: global_head_dim and
    num_global_key_value_heads at the top level in place of the per_layer_config transformers 5
    derives from them (and writes)."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    c.pop("per_layer_config")
    c["global_head_dim"] = GEMMA4_GLOBAL["global_head_dim"]
    c["num_global_key_value_heads"] = GEMMA4_GLOBAL["num_global_key_value_heads"]
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def RandomizeGemma4(model, seed):
    """make_fixtures.RandomizeWeights, then what it would leave near 0 or 1 set so that it
    matters: router.proj N(0, 1) (its input is RMS-normed and scaled by hidden^-0.5, so the
    router's logits spread about 1), router.scale 1 + N(0, 0.1^2), per_expert_scale
    1 + N(0, 0.3^2), each layer_scalar (a buffer) U(0.5, 1.5)."""
    import torch

    mf.RandomizeWeights(model, seed)
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for layer in model.model.layers:
            r = layer.router
            r.proj.weight.copy_(torch.randn(r.proj.weight.shape, generator=gen))
            r.scale.copy_(1.0 + 0.1 * torch.randn(r.scale.shape, generator=gen))
            r.per_expert_scale.copy_(1.0 + 0.3 * torch.randn(r.per_expert_scale.shape,
                                                             generator=gen))
            layer.layer_scalar.copy_(0.5 + torch.rand(layer.layer_scalar.shape, generator=gen))


def Gemma4Forward(model, ids):
    """Logits, the smallest gap between a token's k-th and (k+1)-th router probability, and
    the smallest top-1 logit margin."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_router_logits=True,
                    use_cache=False)
    logits = out.logits[0].float()
    k = model.config.top_k_experts
    sel = float("inf")
    for rl in out.router_logits:
        top = rl.float().topk(k + 1, dim=-1).values
        sel = min(sel, (top[:, k - 1] - top[:, k]).min().item())
    top2 = torch.topk(logits, 2, dim=-1).values
    return logits, sel, (top2[:, 0] - top2[:, 1]).min().item()


def WriteGemma4(name="gemma4"):
    """tests/fixtures/models/gemma4 (or gemma4_global): bf16 weights (RandomizeGemma4), HF's
    float32 logits and greedy continuations, as for the other families; gemma4_global's
    references from transformers loading its config.json in the released layout."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    wide = name == "gemma4_global"
    config = Gemma4TextConfig(**(GEMMA4_GLOBAL if wide else {}))
    out_dir = os.path.join(mf.FIXTURES, "models", name)
    os.makedirs(out_dir, exist_ok=True)
    for attempt in range(20):
        seed = SEED + (2500 if wide else 2000) + attempt
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        RandomizeGemma4(model, seed)
        model = model.to(torch.bfloat16)
        model.save_pretrained(out_dir)
        gen_cfg = os.path.join(out_dir, "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
        if wide:
            Gemma4ReleaseLayout(out_dir)
        ref = mf.LoadReference(out_dir)
        if wide:
            attn = ref.model.layers[1].self_attn
            assert (attn.head_dim, attn.k_proj.out_features, attn.v_proj) == (32, 32, None), \
                "transformers did not read the full layers' own shape"
        gen = torch.Generator().manual_seed(seed)
        tensors = {}
        worst = [float("inf")] * 2
        for i, length in enumerate(mf.RANDOM_PROMPT_LENGTHS):
            ids = torch.randint(3, config.vocab_size, (length,), generator=gen).tolist()
            logits, sel, lm = Gemma4Forward(ref, ids)
            worst = [min(worst[0], sel), min(worst[1], lm)]
            tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"p{i}.logits"] = logits
            seq = list(ids)
            for _ in range(GREEDY_NEW_TOKENS):
                step, sel, lm = Gemma4Forward(ref, seq)
                worst = [min(worst[0], sel), min(worst[1], lm)]
                seq.append(int(torch.argmax(step[-1])))
            tensors[f"g{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
        if worst[0] > 1e-4 and worst[1] > 1e-3:
            break
        print(f"{name}: seed {seed} has a near tie (router {worst[0]:.2e}, logit "
              f"{worst[1]:.2e}); trying the next seed")
    else:
        raise SystemExit(f"{name}: no seed without near ties")
    mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    print(f"{name}: seed {seed}, model.safetensors {size} bytes, min router probability margin "
          f"{worst[0]:.3e}, min top-1 logit margin {worst[1]:.3e}")


def WriteGemma4Multimodal():
    """tests/fixtures/models/gemma4_mm from tests/fixtures/models/gemma4: its weights under
    model.language_model., a random vision tower, references from the wrapper's own forward."""
    import torch
    from safetensors.torch import load_file
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.set_num_threads(2)
    src = os.path.join(mf.FIXTURES, "models", "gemma4")
    out_dir = os.path.join(mf.FIXTURES, "models", "gemma4_mm")
    os.makedirs(out_dir, exist_ok=True)
    config = Gemma4Config(
        text_config=Gemma4TextConfig().to_dict(),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                           patch_size=4, position_embedding_size=64, pooling_kernel_size=2),
        audio_config=None)
    model = Gemma4ForConditionalGeneration(config)
    mf.RandomizeWeights(model, SEED + 3000)
    text = load_file(os.path.join(src, "model.safetensors"))
    with torch.no_grad():
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        for name, t in text.items():
            params["model.language_model." + name[len("model."):]].copy_(t.float())
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    gen_cfg = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    ref = Gemma4ForConditionalGeneration.from_pretrained(out_dir, dtype=torch.float32,
                                                         attn_implementation="eager")
    ref.eval()
    old = load_file(os.path.join(src, "logits.safetensors"))
    refs = {}
    moved = 0.0
    for i in range(len(mf.RANDOM_PROMPT_LENGTHS)):
        ids = old[f"p{i}.ids"].tolist()
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        moved = max(moved, (logits - old[f"p{i}.logits"]).abs().max().item())
        refs[f"p{i}.ids"] = old[f"p{i}.ids"]
        refs[f"p{i}.logits"] = logits
        seq = list(ids)
        for _ in range(GREEDY_NEW_TOKENS):
            with torch.no_grad():
                step = ref(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(step)))
        refs[f"g{i}.ids"] = old[f"p{i}.ids"].clone()
        refs[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
    mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), refs)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    print(f"gemma4_mm: model.safetensors {size} bytes; the wrapper's logits differ from the "
          f"text model's by up to {moved:.3e}")


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def QuantizeMxfp4(w):
    """w [..., rows, cols] float (cols a multiple of 32) as MXFP4: blocks uint8
    [..., rows, cols/32, 16] (two E2M1 codes a byte, low nibble first) and scales uint8
    [..., rows, cols/32] (E8M0: the factor 2^(s - 127)). A block's exponent puts its largest
    magnitude at most 6 (E2M1's largest value); each value is rounded to the nearest code."""
    import numpy as np

    w = np.asarray(w, dtype=np.float32)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), 0).astype(np.int32)
    scaled = g / np.ldexp(np.float32(1), exp)
    grid = np.array(E2M1, dtype=np.float32)
    mag = np.abs(scaled)[..., None]
    code = np.argmin(np.abs(mag - grid), axis=-1).astype(np.uint8)
    code = code | np.where(scaled < 0, 8, 0).astype(np.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    scales = (exp[..., 0] + 127).astype(np.uint8)
    return blocks, scales


def WriteGptOssMxfp4():
    """tests/fixtures/models/gpt_oss_mxfp4 from tests/fixtures/models/gpt_oss: every layer's
    experts.gate_up_proj [E, H, 2I] and down_proj [E, I, H] become MXFP4 over their [out, in]
    transposes; the rest is copied. The references are transformers' own reading of it."""
    import shutil

    import torch
    from safetensors.torch import load_file

    src = os.path.join(mf.FIXTURES, "models", "gpt_oss")
    out_dir = os.path.join(mf.FIXTURES, "models", "gpt_oss_mxfp4")
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            blocks, scales = QuantizeMxfp4(t.float().transpose(1, 2).contiguous().numpy())
            tensors[name + "_blocks"] = torch.from_numpy(blocks)
            tensors[name + "_scales"] = torch.from_numpy(scales)
        else:
            tensors[name] = t
    mf.SaveTensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    from transformers import AutoModelForCausalLM, Mxfp4Config

    torch.set_num_threads(2)
    ref = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager",
        quantization_config=Mxfp4Config(dequantize=True))
    ref.eval()
    old = load_file(os.path.join(src, "logits.safetensors"))
    refs = {}
    for i in range(len(mf.RANDOM_PROMPT_LENGTHS)):
        ids = old[f"p{i}.ids"].tolist()
        logits, _, _ = GptOssForward(ref, ids)
        refs[f"p{i}.ids"] = old[f"p{i}.ids"]
        refs[f"p{i}.logits"] = logits
        seq = list(ids)
        for _ in range(GREEDY_NEW_TOKENS):
            step, _, _ = GptOssForward(ref, seq)
            seq.append(int(torch.argmax(step[-1])))
        refs[f"g{i}.ids"] = old[f"p{i}.ids"].clone()
        refs[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
    mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), refs)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    moved = max((refs[f"p{i}.logits"] - old[f"p{i}.logits"]).abs().max().item()
                for i in range(len(mf.RANDOM_PROMPT_LENGTHS)))
    print(f"gpt_oss_mxfp4: model.safetensors {size} bytes; MXFP4 moves the bf16 model's logits "
          f"by up to {moved:.3e}")


def Write(only):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    for index, (name, config) in enumerate(Configs().items()):
        if only and name not in only:
            continue
        out_dir = os.path.join(mf.FIXTURES, "models", name)
        os.makedirs(out_dir, exist_ok=True)
        for attempt in range(20):
            seed = SEED + 100 * index + attempt
            torch.manual_seed(seed)
            if config.model_type == "qwen3_5_moe":
                model = ModelClass(config)._from_config(config, attn_implementation="eager")
            else:
                model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
            glm = config.model_type == "glm4_moe"
            if glm:
                Randomize(model, seed)
            else:
                mf.RandomizeWeights(model, seed)
            model = model.to(torch.bfloat16)
            model.save_pretrained(out_dir)
            if glm:
                ReleaseLayout(out_dir)
                AddMtpTensors(out_dir, config, seed)
            elif os.path.exists(os.path.join(out_dir, "generation_config.json")):
                os.remove(os.path.join(out_dir, "generation_config.json"))
            ref = LoadReference(out_dir, config)
            gen = torch.Generator().manual_seed(seed)
            tensors = {}
            worst = [float("inf")] * 3
            for i, length in enumerate(PROMPT_LENGTHS.get(name, mf.RANDOM_PROMPT_LENGTHS)):
                vocab = getattr(config, "text_config", config).vocab_size
                ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
                logits, sel, grp, lm = Forward(ref, ids)
                worst = [min(worst[0], sel), min(worst[1], grp), min(worst[2], lm)]
                tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"p{i}.logits"] = logits
                seq = list(ids)
                for _ in range(GREEDY_NEW_TOKENS):
                    step, sel, grp, lm = Forward(ref, seq)
                    worst = [min(worst[0], sel), min(worst[1], grp), min(worst[2], lm)]
                    seq.append(int(torch.argmax(step[-1])))
                tensors[f"g{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
            if worst[0] > 1e-4 and worst[1] > 1e-4 and worst[2] > 1e-3:
                break
            print(f"{name}: seed {seed} has a near tie (selection {worst[0]:.2e}, group "
                  f"{worst[1]:.2e}, logit {worst[2]:.2e}); trying the next seed")
        else:
            raise SystemExit(f"{name}: no seed without near ties")
        mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
        size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
        print(f"{name}: seed {seed}, model.safetensors {size} bytes, min selection margin "
              f"{worst[0]:.3e}, min group margin {worst[1]:.3e}, min top-1 logit margin "
              f"{worst[2]:.3e}")


def AddDeepseekMtpTensors(out_dir, config, seed):
    """An MTP module's tensors at layer index num_hidden_layers, as DeepSeek-V3 ships them
    (eh_proj, enorm, hnorm, shared_head.norm and a decoder layer's norms); never run."""
    import torch
    from safetensors.torch import load_file

    path = os.path.join(out_dir, "model.safetensors")
    t = load_file(path)
    gen = torch.Generator().manual_seed(seed + 11)
    h = config.hidden_size
    p = f"model.layers.{config.num_hidden_layers}."
    for name, shape in [("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)),
                        ("hnorm.weight", (h,)), ("shared_head.norm.weight", (h,)),
                        ("input_layernorm.weight", (h,)),
                        ("self_attn.kv_a_layernorm.weight", (config.kv_lora_rank,))]:
        t[p + name] = (0.1 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    mf.SaveTensors(path, t)


FP8_BLOCK = 128
FP8_MAX = 448.0


def QuantizeFp8Blocks(w):
    """w [rows, cols] float32 as DeepSeek-V3 stores it: float8_e4m3fn values and a float32
    weight_scale_inv [ceil(rows/128), ceil(cols/128)], one per 128x128 block (edge blocks
    partial): scale = amax / 448, value = fp8(w / scale), w ~ value * scale."""
    import numpy as np
    import torch

    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    br, bc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    scale = np.zeros((br, bc), dtype=np.float32)
    scaled = np.zeros_like(w)
    for i in range(br):
        for j in range(bc):
            blk = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            s = np.float32(np.abs(blk).max() / FP8_MAX) if np.abs(blk).max() > 0 else np.float32(1)
            scale[i, j] = s
            scaled[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = blk / s
    return torch.from_numpy(scaled).to(torch.float8_e4m3fn), torch.from_numpy(scale)


def Fp8Quantized(name, t):
    """Whether DeepSeek-V3 stores tensor `name` in FP8: the linear weights, not the router
    (mlp.gate), the embeddings, lm_head, the norms or the MTP module's extras."""
    if not name.endswith(".weight") or t.dim() != 2:
        return False
    return not (name.endswith("mlp.gate.weight") or "embed_tokens" in name or
                name.startswith("lm_head") or "norm" in name or "eh_proj" in name)


def CastFp8ToBf16(out_dir, tensors, config):
    """The FP8 checkpoint as DeepSeek's fp8_cast_bf16.py converts it (each value times its
    block's weight_scale_inv in fp32, partial edge blocks included, rounded to bf16), in a
    temporary directory beside out_dir; returns that directory. transformers' own FP8 loader
    (FineGrainedFP8Config(dequantize=True)) derives the block from the scale grid (rows //
    scale rows), which is not 128 where a dimension is not a multiple of 128, so it is not
    the reference here."""
    import shutil
    import tempfile

    import torch

    tmp = tempfile.mkdtemp(prefix="deepseek_fp8_ref_")
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = tensors[name + "_scale_inv"]
            rows, cols = t.shape
            full = s.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
            out[name] = (t.float() * full).to(torch.bfloat16)
        else:
            out[name] = t
    mf.SaveTensors(os.path.join(tmp, "model.safetensors"), out)
    with open(os.path.join(out_dir, "config.json")) as f:
        c = json.load(f)
    c.pop("quantization_config")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f)
    import atexit

    atexit.register(shutil.rmtree, tmp, True)
    return tmp


def WriteDeepseek(only):
    """The deepseek_v3 / kimi_k2 fixtures (see the top of this file)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    for index, (name, config) in enumerate(DeepseekConfigs().items()):
        if only and name not in only:
            continue
        out_dir = os.path.join(mf.FIXTURES, "models", name)
        os.makedirs(out_dir, exist_ok=True)
        for attempt in range(20):
            seed = SEED + 5000 + 100 * index + attempt
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
            Randomize(model, seed)
            model = model.to(torch.bfloat16)
            model.save_pretrained(out_dir)
            gen_cfg = os.path.join(out_dir, "generation_config.json")
            if os.path.exists(gen_cfg):
                os.remove(gen_cfg)
            AddDeepseekMtpTensors(out_dir, config, seed)
            if name == "deepseek_v3_fp8":
                path = os.path.join(out_dir, "model.safetensors")
                tensors = {}
                for tname, t in load_file(path).items():
                    if Fp8Quantized(tname, t) and not tname.startswith(
                            f"model.layers.{config.num_hidden_layers}."):
                        q, s = QuantizeFp8Blocks(t.float().numpy())
                        tensors[tname] = q
                        tensors[tname + "_scale_inv"] = s
                    else:
                        tensors[tname] = t
                mf.SaveTensors(path, tensors)
                cpath = os.path.join(out_dir, "config.json")
                with open(cpath) as f:
                    c = json.load(f)
                c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                            "quant_method": "fp8",
                                            "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
                with open(cpath, "w") as f:
                    json.dump(c, f, indent=2, sort_keys=True)
                    f.write("\n")
                ref = mf.LoadReference(CastFp8ToBf16(out_dir, tensors, config))
            else:
                ref = mf.LoadReference(out_dir)
            gen = torch.Generator().manual_seed(seed)
            tensors = {}
            worst = [float("inf")] * 3
            for i, length in enumerate(mf.RANDOM_PROMPT_LENGTHS):
                ids = torch.randint(3, config.vocab_size, (length,), generator=gen).tolist()
                logits, sel, grp, lm = DeepseekForward(ref, ids)
                worst = [min(worst[0], sel), min(worst[1], grp), min(worst[2], lm)]
                tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"p{i}.logits"] = logits
                seq = list(ids)
                for _ in range(GREEDY_NEW_TOKENS):
                    step, sel, grp, lm = DeepseekForward(ref, seq)
                    worst = [min(worst[0], sel), min(worst[1], grp), min(worst[2], lm)]
                    seq.append(int(torch.argmax(step[-1])))
                tensors[f"g{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"g{i}.out"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
            if worst[0] > 1e-4 and worst[1] > 1e-4 and worst[2] > 1e-3:
                break
            print(f"{name}: seed {seed} has a near tie (selection {worst[0]:.2e}, group "
                  f"{worst[1]:.2e}, logit {worst[2]:.2e}); trying the next seed")
        else:
            raise SystemExit(f"{name}: no seed without near ties")
        if name == "kimi_k2":
            # Kimi-K2's config.json: its own model_type over the DeepseekV3 architecture.
            cpath = os.path.join(out_dir, "config.json")
            with open(cpath) as f:
                c = json.load(f)
            c["model_type"] = "kimi_k2"
            c["architectures"] = ["DeepseekV3ForCausalLM"]
            with open(cpath, "w") as f:
                json.dump(c, f, indent=2, sort_keys=True)
                f.write("\n")
        mf.SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
        size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
        print(f"{name}: seed {seed}, model.safetensors {size} bytes, min selection margin "
              f"{worst[0]:.3e}, min group margin {worst[1]:.3e}, min top-1 logit margin "
              f"{worst[2]:.3e}")


def DeepseekForward(model, ids):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_router_logits=True,
                    use_cache=False)
    logits = out.logits[0].float()
    sel, grp = SelectionMargins(model, out.router_logits)
    top2 = torch.topk(logits, 2, dim=-1).values
    return logits, sel, grp, (top2[:, 0] - top2[:, 1]).min().item()


DEEPSEEK = {"deepseek_v3", "deepseek_v3_direct", "kimi_k2", "deepseek_v3_fp8"}


if __name__ == "__main__":
    names = set(sys.argv[1:])
    if not names or "gpt_oss" in names:
        WriteGptOss()
    if not names or "gpt_oss" in names or "gpt_oss_mxfp4" in names:
        WriteGptOssMxfp4()
    if not names or "gemma4" in names:
        WriteGemma4()
    if not names or "gemma4" in names or "gemma4_mm" in names:
        WriteGemma4Multimodal()
    if not names or "gemma4_global" in names:
        WriteGemma4("gemma4_global")
    # Every fixture when no name is given; else the named ones only.
    everything = not names
    if everything or names & DEEPSEEK:
        WriteDeepseek(names & DEEPSEEK)
    names -= {"gpt_oss", "gpt_oss_mxfp4", "gemma4", "gemma4_mm", "gemma4_global"} | DEEPSEEK
    if names or not sys.argv[1:]:
        Write(names)
