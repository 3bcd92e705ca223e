#!/usr/bin/env python3
"""hf_oracle.py - goldens from Hugging Face `transformers` for hpdl's samples (issue 19).

For a family (llama, mixtral, qwen3, qwen3_moe, gpt_oss, deepseek_v3), builds a tiny random
configuration with `transformers`, rounds its weights to fp32, and computes in fp64 the loss
(the mean cross-entropy over every position) and the gradients of a fixed batch. It writes,
under tests/oracle/:

  FAMILY.safetensors   the weights under hpdl's names (the mappings below: Hugging Face's
                       Linear weights [out, in] become hpdl's [in, out]), for
                       `hpdlrun --init-from`; the gradients as grad.NAME; a state's value
                       after the step as after.NAME (DeepSeek-V3's routing bias)
  FAMILY.bin           the batch as a token file (hpdl-data's format): B windows of T + 1
                       tokens, consecutive windows sharing one token
  FAMILY.json          the sample, its -D shapes, the batch, the loss, the versions

tests/oracle/oracle_e2e.py compares hpdl against them, so the suite needs no PyTorch.
Run it where `transformers` and torch are installed. Llama and Mixtral were written with
transformers 4.46.3 over Debian's torch 1.13 (python3 -m venv --system-site-packages V;
V/bin/pip install transformers==4.46.3); the others need transformers >= 5 (Qwen3 came in
4.51, GPT-OSS in 4.55) and so torch 2: they were written with transformers 5.24.0 and torch
2.15.0 from PyPI (V/bin/pip install torch transformers safetensors; on a machine without a
GPU, `pip install --no-deps` of the torch wheel plus its pure-Python dependencies and the
few CUDA libraries its import loads avoids most of the 3 GB of CUDA packages). A family's
weights differ between transformers versions (their initialisation draws differently), so
a golden is regenerated only together with its family's test.
"""
import argparse
import json
import os
import struct
import sys

# Each family: the sample it checks, the shapes (-D) of a tiny instance, and its
# transformers class. Auxiliary losses are off on both sides (transformers adds none to a
# loss computed from the logits), so the loss is the cross-entropy alone.
FAMILIES = {
    "llama": {"sample": "samples/llama.hpd",
              "defines": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "ffn": 32, "seq": 8, "vocab": 64}},
    "mixtral": {"sample": "samples/mixtral.hpd",
                "defines": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "ffn": 8, "experts": 4, "seq": 8,
                            "vocab": 64, "aux_loss": 0}},
    # a head width (8) that is not hidden / heads (4): the projections widen
    "qwen3": {"sample": "samples/qwen3.hpd",
              "defines": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "head_dim": 8, "ffn": 32, "seq": 8,
                          "vocab": 64}},
    "qwen3_moe": {"sample": "samples/qwen3-moe.hpd",
                  "defines": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "head_dim": 8, "ffn": 8,
                              "experts": 4, "top_k": 2, "seq": 8, "vocab": 64, "aux_loss": 0}},
    # two pairs of blocks: each a sliding window of 4 keys, then full attention
    "gpt_oss": {"sample": "samples/gpt-oss.hpd",
                "defines": {"layers": 4, "hidden": 16, "heads": 4, "kv_heads": 2, "head_dim": 8, "experts": 4,
                            "top_k": 2, "ffn": 8, "window": 4, "seq": 8, "vocab": 64, "aux_loss": 0}},
    # one dense block, two MoE blocks with a shared expert and a routing bias
    "deepseek_v3": {"sample": "samples/deepseek-v3.hpd",
                    "defines": {"layers": 3, "dense": 1, "hidden": 16, "heads": 4, "q_lora": 8, "kv_lora": 8,
                                "qk_nope": 4, "qk_rope": 4, "v_head_dim": 4, "ffn": 32, "moe_ffn": 8, "experts": 4,
                                "top_k": 2, "seq": 8, "vocab": 64, "aux_loss": 0, "groups": 1,
                                "group_top_k": 1}},
    # node-limited routing: 8 experts in 4 blocks of 2, a token's 2 within its best 2 blocks
    # (written 2026-12-04 with transformers 5.25.0 and torch 2.15.0)
    "deepseek_v3_groups": {"sample": "samples/deepseek-v3.hpd",
                           "defines": {"layers": 3, "dense": 1, "hidden": 16, "heads": 4, "q_lora": 8, "kv_lora": 8,
                                       "qk_nope": 4, "qk_rope": 4, "v_head_dim": 4, "ffn": 32, "moe_ffn": 8,
                                       "experts": 8, "top_k": 2, "seq": 8, "vocab": 64, "aux_loss": 0, "groups": 4,
                                       "group_top_k": 2}},
}
BALANCE_RATE = 0.001  # samples/deepseek-v3.hpd's routing-bias update rate (DeepSeekBlock's balance)


def rope_perm(D, n):
    """hpdl's rope rotates adjacent pairs (2i, 2i+1) of a head (Meta's Llama, DeepSeek-V3);
    Hugging Face's Llama-style models rotate halves (i, i + D/2), their checkpoints' q and k
    projections permuted to match. The index of theirs that each of our n*D columns takes:
    ours 2i <- theirs i, ours 2i+1 <- theirs i + D/2 within each head."""
    import torch
    return torch.tensor([h * D + (j // 2 if j % 2 == 0 else D // 2 + j // 2) for h in range(n) for j in range(D)])


def rope_cols(w, D):
    """A [in, n*D] weight (or an [n*D] bias, or a [D] per-head norm) in hpdl's rope order."""
    return w[..., rope_perm(D, w.shape[-1] // D)]


def linear(key):
    """Hugging Face's Linear weight [out, in] as hpdl's [in, out]."""
    return lambda get: get(key).t()


def attention_names(shapes, names, hf_bias=False, norms="qk"):
    """The embedding, attention, norms and head of a Llama-style decoder (Llama, Mixtral, Qwen3,
    GPT-OSS). Blocks are blocks.{i} (GPT-OSS: blocks.{i // 2}.sliding / .full)."""
    D = shapes.get("head_dim") or shapes["hidden"] // shapes["heads"]
    names["embed.weight"] = lambda get: get("model.embed_tokens.weight")
    names["norm.weight"] = lambda get: get("model.norm.weight")
    names["head.weight"] = linear("lm_head.weight")
    for i in range(shapes["layers"]):
        p, h = block_name(shapes, i), f"model.layers.{i}."
        names[p + "ln1.weight"] = lambda get, h=h: get(h + "input_layernorm.weight")
        names[p + "ln2.weight"] = lambda get, h=h: get(h + "post_attention_layernorm.weight")
        for x in ("q", "k", "v", "o"):
            key = h + f"self_attn.{x}_proj."
            w, b = linear(key + "weight"), (lambda get, key=key: get(key + "bias"))
            names[p + f"attn.{x}_proj.weight"] = (lambda get, w=w: rope_cols(w(get), D)) if x in "qk" else w
            if hf_bias:
                names[p + f"attn.{x}_proj.b"] = (lambda get, b=b: rope_cols(b(get), D)) if x in "qk" else b
        if "q_norm" in norms:  # Qwen3: RMSNorm over a head's D, before RoPE: its weight follows the columns
            for x in ("q", "k"):
                names[p + f"attn.{x}_norm.weight"] = lambda get, h=h, x=x: rope_cols(get(h + f"self_attn.{x}_norm.weight"), D)


def block_name(shapes, i):
    if shapes.get("pairs"):
        return f"blocks.{i // 2}.{'sliding' if i % 2 == 0 else 'full'}."
    return f"blocks.{i}."


def stacked_experts(names, p, h, E, I, fused):
    """Experts as hpdl's batched [E, in, out] weights: gate, up, down. transformers >= 5 holds
    them fused (gate_up_proj [E, 2I, C], gate first; down_proj [E, C, I]); earlier versions
    one Linear per expert (Mixtral's w1 gate, w3 up, w2 down; Qwen3-MoE's gate_proj, up_proj,
    down_proj)."""
    import torch
    if fused:
        names[p + "expert.gate"] = lambda get: get(h + "experts.gate_up_proj")[:, :I, :].transpose(1, 2)
        names[p + "expert.up"] = lambda get: get(h + "experts.gate_up_proj")[:, I:, :].transpose(1, 2)
        names[p + "expert.down"] = lambda get: get(h + "experts.down_proj").transpose(1, 2)
        return
    for ours, w in zip(("gate", "up", "down"), per_expert_names(h)):
        names[p + f"expert.{ours}"] = lambda get, w=w: torch.stack([get(h + f"experts.{e}.{w}.weight").t()
                                                                    for e in range(E)])


def per_expert_names(h):
    return ("w1", "w3", "w2") if "block_sparse_moe" in h else ("gate_proj", "up_proj", "down_proj")


def has(model, key):
    return key in dict(model.named_parameters())


def llama(shapes):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                      num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                      num_key_value_heads=shapes["kv_heads"], max_position_embeddings=shapes["seq"],
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, initializer_range=0.2)
    names = {}
    attention_names(shapes, names, norms="")
    dense_names(shapes, names, range(shapes["layers"]))
    return LlamaForCausalLM(cfg), names


def dense_names(shapes, names, layers, prefix=None):
    for i in layers:
        p, h = (prefix(i) if prefix else block_name(shapes, i)), f"model.layers.{i}.mlp."
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            names[p + f"mlp.{ours}.weight"] = linear(h + theirs + ".weight")


def mixtral(shapes):
    from transformers import MixtralConfig, MixtralForCausalLM
    E = shapes["experts"]
    cfg = MixtralConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                        num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                        num_key_value_heads=shapes["kv_heads"], max_position_embeddings=shapes["seq"],
                        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                        num_local_experts=E, num_experts_per_tok=2, router_aux_loss_coef=0.0,
                        initializer_range=0.2)
    model = MixtralForCausalLM(cfg)
    names = {}
    attention_names(shapes, names, norms="")
    routed_names(model, shapes, names, lambda i: f"model.layers.{i}.mlp." if has(model, f"model.layers.{i}.mlp.gate.weight")
                 else f"model.layers.{i}.block_sparse_moe.")
    return model, names


def routed_names(model, shapes, names, mlp_of):
    """Every block's router (HF's `gate`) and stacked experts, the block's MoE module at
    mlp_of(i) (Mixtral's block_sparse_moe before transformers 5, mlp after)."""
    for i in range(shapes["layers"]):
        p, h = f"blocks.{i}.mlp.", mlp_of(i)
        names[p + "router.weight"] = linear(h + "gate.weight")
        stacked_experts(names, p, h, shapes["experts"], shapes["ffn"], has(model, h + "experts.gate_up_proj"))


def qwen3(shapes):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                      num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                      num_key_value_heads=shapes["kv_heads"], head_dim=shapes["head_dim"],
                      max_position_embeddings=shapes["seq"], rms_norm_eps=1e-6, rope_theta=1000000.0,
                      tie_word_embeddings=False, attention_bias=False, use_sliding_window=False)
    names = {}
    attention_names(shapes, names, norms="q_norm")
    dense_names(shapes, names, range(shapes["layers"]))
    return Qwen3ForCausalLM(cfg), names


def qwen3_moe(shapes):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    E = shapes["experts"]
    cfg = Qwen3MoeConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], moe_intermediate_size=shapes["ffn"],
                         intermediate_size=4 * shapes["ffn"], num_hidden_layers=shapes["layers"],
                         num_attention_heads=shapes["heads"], num_key_value_heads=shapes["kv_heads"],
                         head_dim=shapes["head_dim"], max_position_embeddings=shapes["seq"], rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=False, num_experts=E,
                         num_experts_per_tok=shapes["top_k"], norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], router_aux_loss_coef=0.0, use_sliding_window=False)
    model = Qwen3MoeForCausalLM(cfg)
    names = {}
    attention_names(shapes, names, norms="q_norm")
    routed_names(model, shapes, names, lambda i: f"model.layers.{i}.mlp.")
    return model, names


def gpt_oss(shapes):
    """GPT-OSS with its config's RoPE: YaRN, factor 32 over an original 4096 positions, not
    truncated, base 150000 (GptOssConfig's defaults, as gpt-oss-120b's config.json)."""
    from transformers import GptOssConfig, GptOssForCausalLM
    E, I = shapes["experts"], shapes["ffn"]
    cfg = GptOssConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=I,
                       num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                       num_key_value_heads=shapes["kv_heads"], head_dim=shapes["head_dim"],
                       rms_norm_eps=1e-5, sliding_window=shapes["window"],
                       layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                    for i in range(shapes["layers"])],
                       num_local_experts=E, num_experts_per_tok=shapes["top_k"], router_aux_loss_coef=0.0,
                       tie_word_embeddings=False)
    rp = cfg.rope_parameters
    if rp.get("rope_type") != "yarn" or rp.get("factor") != 32.0 or rp.get("truncate") is not False:
        sys.exit(f"hf_oracle: GptOssConfig's RoPE is not the sample's YaRN: {rp}")
    shapes = dict(shapes, pairs=True)
    names = {}
    attention_names(shapes, names, hf_bias=True, norms="")
    for i in range(shapes["layers"]):
        p, h = block_name(shapes, i), f"model.layers.{i}."
        names[p + "attn.sink"] = lambda get, h=h: get(h + "self_attn.sinks")
        m = h + "mlp."
        names[p + "mlp.router.weight"] = linear(m + "router.weight")
        names[p + "mlp.router.b"] = lambda get, m=m: get(m + "router.bias")
        # gate_up_proj [E, C, 2I] interleaves gate (even columns) and up (odd)
        names[p + "mlp.expert.gate"] = lambda get, m=m: get(m + "experts.gate_up_proj")[:, :, 0::2]
        names[p + "mlp.expert.up"] = lambda get, m=m: get(m + "experts.gate_up_proj")[:, :, 1::2]
        names[p + "mlp.expert.gate_b"] = lambda get, m=m: get(m + "experts.gate_up_proj_bias")[:, None, 0::2]
        names[p + "mlp.expert.up_b"] = lambda get, m=m: get(m + "experts.gate_up_proj_bias")[:, None, 1::2]
        names[p + "mlp.expert.down"] = lambda get, m=m: get(m + "experts.down_proj")
        names[p + "mlp.down_b"] = lambda get, m=m: get(m + "experts.down_proj_bias")
    return GptOssForCausalLM(cfg), names


def deepseek_v3(shapes):
    """DeepSeek-V3: MLA (its RoPE part interleaved, as hpdl's rope: no permutation) with the
    config's YaRN (factor 40 over 4096, mscale = mscale_all_dim = 1), the node limit of its
    `groups` and `group_top_k` defines (n_group, topk_group; the golden of 2026-12-02 has
    groups 1, no limit), a shared expert, the
    routing bias as the state hpdl's balance_experts updates."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    E, dense = shapes["experts"], shapes["dense"]
    cfg = DeepseekV3Config(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                           moe_intermediate_size=shapes["moe_ffn"], num_hidden_layers=shapes["layers"],
                           first_k_dense_replace=dense, num_attention_heads=shapes["heads"],
                           num_key_value_heads=shapes["heads"], q_lora_rank=shapes["q_lora"],
                           kv_lora_rank=shapes["kv_lora"], qk_nope_head_dim=shapes["qk_nope"],
                           qk_rope_head_dim=shapes["qk_rope"], v_head_dim=shapes["v_head_dim"],
                           n_routed_experts=E, num_experts_per_tok=shapes["top_k"], n_shared_experts=1,
                           n_group=shapes.get("groups", 1), topk_group=shapes.get("group_top_k", 1), norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
                           max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                            "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
    model = DeepseekV3ForCausalLM(cfg)
    counts = shapes["layers"] - dense

    def blk(i):  # a repeat of one block names its parameters without an index
        if i < dense:
            return f"dense_blocks.{i}." if dense > 1 else "dense_blocks."
        return f"moe_blocks.{i - dense}." if counts > 1 else "moe_blocks."
    names = {}
    names["embed.weight"] = lambda get: get("model.embed_tokens.weight")
    names["norm.weight"] = lambda get: get("model.norm.weight")
    names["head.weight"] = linear("lm_head.weight")
    for i in range(shapes["layers"]):
        p, h = blk(i), f"model.layers.{i}."
        names[p + "ln1.weight"] = lambda get, h=h: get(h + "input_layernorm.weight")
        names[p + "ln2.weight"] = lambda get, h=h: get(h + "post_attention_layernorm.weight")
        a = h + "self_attn."
        for ours, theirs in (("q_a", "q_a_proj"), ("q_b", "q_b_proj"), ("kv_a", "kv_a_proj_with_mqa"),
                             ("kv_b", "kv_b_proj"), ("o_proj", "o_proj")):
            names[p + f"attn.{ours}.weight"] = linear(a + theirs + ".weight")
        names[p + "attn.q_a_norm.weight"] = lambda get, a=a: get(a + "q_a_layernorm.weight")
        names[p + "attn.kv_a_norm.weight"] = lambda get, a=a: get(a + "kv_a_layernorm.weight")
        if i < dense:
            dense_names(shapes, names, [i], prefix=blk)
            continue
        m = h + "mlp."
        names[p + "mlp.router.weight"] = linear(m + "gate.weight")
        stacked_experts(names, p + "mlp.", m, E, shapes["moe_ffn"], has(model, m + "experts.gate_up_proj"))
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            names[p + f"mlp.shared.{ours}.weight"] = linear(m + f"shared_experts.{theirs}.weight")
    return model, names


BUILDERS = {"llama": llama, "mixtral": mixtral, "qwen3": qwen3, "qwen3_moe": qwen3_moe, "gpt_oss": gpt_oss,
            "deepseek_v3": deepseek_v3, "deepseek_v3_groups": deepseek_v3}
# Families whose weights are drawn again after construction (the two first kept the
# initialisation they were generated with): every weight N(0, 0.2), every norm's 1 + N(0, 0.1),
# sinks N(0, 1), so that nothing a mapping could get wrong is a constant.
REDRAWN = {"qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v3_groups"}


def redraw(model):
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))


def route_hooks(model, chosen):
    """Records, for every router, the experts each token chose and the margin of its choice
    (the k-th score less the next): hpdl computes in fp32, so a near tie could choose
    differently and the comparison would test the tie, not the model."""
    import torch

    def scores_of(module, out):
        if isinstance(out, tuple) and len(out) == 3:  # (logits, weights, indices): Qwen3-MoE, DeepSeek-V3, GPT-OSS
            logits, _, idx = out
            return logits, idx
        return out, None  # Mixtral (transformers 4.46): the logits alone

    def hook(module, inputs, out):
        logits, idx = scores_of(module, out)
        k = idx.shape[-1] if idx is not None else 2
        s = logits.detach().double().reshape(-1, logits.shape[-1])
        if hasattr(module, "e_score_correction_bias"):
            s = s.sigmoid() + module.e_score_correction_bias.double()
        top = torch.topk(s, k + 1 if k < s.shape[-1] else k, dim=-1).values
        margin = float((top[:, k - 1] - top[:, k]).min()) if k < s.shape[-1] else float("inf")
        chosen.append({"indices": None if idx is None else idx.detach().reshape(-1, k), "margin": margin,
                       "module": module})

    for name, mod in model.named_modules():
        if name.endswith("mlp.gate") or name.endswith("mlp.router") or name.endswith("block_sparse_moe.gate"):
            mod.register_forward_hook(hook)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    import transformers
    from safetensors.torch import save_file
    torch.manual_seed(a.seed)
    fam = FAMILIES[a.family]
    shapes = fam["defines"]
    model, names = BUILDERS[a.family](shapes)
    if a.family in REDRAWN:
        redraw(model)
    if hasattr(model, "set_attn_implementation"):  # transformers >= 5: the plain softmax(q k^T) v, sinks
        model.set_attn_implementation("eager")      # included; the experts one by one (its grouped GEMM
    if hasattr(model, "set_experts_implementation"):  # takes no fp64)
        model.set_experts_implementation("eager")
    model = model.double()
    with torch.no_grad():  # the weights hpdl starts from are fp32: compute with those
        # the routing bias is a buffer but hpdl's state: rounded too; RoPE's tables are not
        rounded = list(model.parameters()) + [b for name, b in model.named_buffers()
                                              if name.endswith("e_score_correction_bias")]
        for p in rounded:
            p.copy_(p.float().double())
    T, B, V = shapes["seq"], a.batch, shapes["vocab"]
    stream = torch.randint(0, V, (B * T + 1,), generator=torch.Generator().manual_seed(a.seed + 1))
    tokens = torch.stack([stream[b * T:b * T + T] for b in range(B)])
    targets = torch.stack([stream[b * T + 1:b * T + T + 1] for b in range(B)])
    routed = []
    route_hooks(model, routed)
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    margin = min([r["margin"] for r in routed], default=float("inf"))
    if margin < 1e-4:
        sys.exit(f"hf_oracle: a token's k-th and next expert are {margin:.2g} apart: too close for an fp32 "
                 f"comparison; try another --seed")
    params = dict(model.named_parameters())
    used = set()

    def weight(name):
        used.add(name)
        return params[name].detach()

    def grad(name):
        return params[name].grad.detach()

    out = {}
    for ours, conv in names.items():
        out[ours] = conv(weight).float().contiguous()
        out["grad." + ours] = conv(grad).float().contiguous()
    # DeepSeek-V3's routing bias is state, not a parameter: hpdl moves it after the step by
    # rate sign(mean load - load), the loads counted over the batch (after.NAME)
    state = 0
    for i, r in enumerate([r for r in routed if hasattr(r["module"], "e_score_correction_bias")]):
        bias = r["module"].e_score_correction_bias.detach()
        E = bias.shape[0]
        load = torch.bincount(r["indices"].reshape(-1), minlength=E).double()
        ours = [n for n in names if n.endswith("mlp.router.weight")][i].replace("router.weight", "route_bias")
        out[ours] = bias.float().contiguous()
        out["after." + ours] = (bias + BALANCE_RATE * torch.sign(load.mean() - load)).float().contiguous()
        state += 1
    missing = set(params) - used
    if missing:
        sys.exit(f"hf_oracle: no hpdl name for {sorted(missing)}")
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, a.family)
    save_file(out, base + ".safetensors")
    toks = [int(t) for t in stream]
    with open(base + ".bin", "wb") as f:  # hpdl-data's format: 256 int32 header, uint16 tokens
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1012) + struct.pack(f"<{len(toks)}H", *toks))
    meta = {"sample": fam["sample"], "defines": shapes, "batch": B, "loss": float(loss.detach()),
            "transformers": transformers.__version__, "torch": torch.__version__, "seed": a.seed,
            "what": "loss: mean cross-entropy over every position, fp64 on the fp32 weights; grad.NAME: its gradients"
                    "; after.NAME: a state's value after the step"}
    if routed:
        meta["route_margin"] = margin
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{base}.safetensors: {len(names)} weights and their gradients, {state} states; loss {float(loss.detach()):.10f}"
          + (f"; closest routing choice {margin:.3g}" if routed else ""))


if __name__ == "__main__":
    main()
