#!/usr/bin/env python3
"""hf_oracle.py - goldens from Hugging Face `transformers` for hpdl's samples (issue 19).

For a family (llama, mixtral), builds a tiny random configuration with `transformers`, rounds its
weights to fp32, and computes in fp64 the loss (the mean cross-entropy over every position)
and the gradients of a fixed batch. It writes, under tests/oracle/:

  FAMILY.safetensors   the weights under hpdl's names (the mapping below: Hugging Face's
                       Linear weights [out, in] become hpdl's [in, out]), for
                       `hpdlrun --init-from`; and the gradients as grad.NAME
  FAMILY.bin           the batch as a token file (hpdl-data's format): B windows of T + 1
                       tokens, consecutive windows sharing one token
  FAMILY.json          the sample, its -D shapes, the batch, the loss, the versions

tests/oracle/oracle_e2e.py compares hpdl against them, so the suite needs no PyTorch.
Run it where `transformers` and torch are installed (transformers 4.46 works with the
Debian torch 1.13: python3 -m venv --system-site-packages V; V/bin/pip install
transformers==4.46.3; V/bin/python tools/hf_oracle.py llama).
"""
import argparse
import json
import os
import struct
import sys

SHAPES = {
    "llama": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "ffn": 32, "seq": 8, "vocab": 64},
    # the sample's own loss only (transformers' Mixtral adds no router loss unless asked)
    "mixtral": {"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "ffn": 8, "experts": 4, "seq": 8, "vocab": 64,
                "aux_loss": 0},
}


def rope_cols(w, D):
    """hpdl's rope rotates adjacent pairs (2i, 2i+1) of a head (Meta's Llama, DeepSeek-V3);
    Hugging Face's Llama rotates halves (i, i + D/2), its conversion having permuted Meta's
    q and k projections. The inverse permutation of each head's D output columns of a
    [in, H*D] weight: ours 2i <- theirs i, ours 2i+1 <- theirs i + D/2."""
    import torch
    n = w.shape[1] // D
    idx = torch.tensor([h * D + (j // 2 if j % 2 == 0 else D // 2 + j // 2) for h in range(n) for j in range(D)])
    return w[:, idx]


def attention_names(shapes, names):
    """The embedding, attention, norms and head of a Llama-style decoder (Llama, Mixtral)."""
    D = shapes["hidden"] // shapes["heads"]
    names["embed.weight"] = lambda get: get("model.embed_tokens.weight")
    names["norm.weight"] = lambda get: get("model.norm.weight")
    names["head.weight"] = lambda get: get("lm_head.weight").t()
    for i in range(shapes["layers"]):
        p, h = f"blocks.{i}.", f"model.layers.{i}."
        names[p + "ln1.weight"] = lambda get, h=h: get(h + "input_layernorm.weight")
        names[p + "ln2.weight"] = lambda get, h=h: get(h + "post_attention_layernorm.weight")
        for x in ("q", "k", "v", "o"):
            t = lambda get, h=h, x=x: get(h + f"self_attn.{x}_proj.weight").t()
            names[p + f"attn.{x}_proj.weight"] = (lambda get, t=t: rope_cols(t(get), D)) if x in "qk" else t


def llama(shapes):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                      num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                      num_key_value_heads=shapes["kv_heads"], max_position_embeddings=shapes["seq"],
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, initializer_range=0.2)
    names = {}
    attention_names(shapes, names)
    for i in range(shapes["layers"]):
        p, h = f"blocks.{i}.", f"model.layers.{i}.mlp."
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            names[p + f"mlp.{ours}.weight"] = lambda get, h=h, t=theirs: get(h + t + ".weight").t()
    return LlamaForCausalLM(cfg), names


def mixtral(shapes):
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    E = shapes["experts"]
    cfg = MixtralConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                        num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                        num_key_value_heads=shapes["kv_heads"], max_position_embeddings=shapes["seq"],
                        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                        num_local_experts=E, num_experts_per_tok=2, router_aux_loss_coef=0.0,
                        initializer_range=0.2)
    names = {}
    attention_names(shapes, names)
    for i in range(shapes["layers"]):
        p, h = f"blocks.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
        names[p + "router.weight"] = lambda get, h=h: get(h + "gate.weight").t()
        # the experts as batched weights [E, in, out]: w1 the gate, w3 the up, w2 the down
        for ours, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            names[p + f"expert.{ours}"] = lambda get, h=h, w=w: torch.stack(
                [get(h + f"experts.{e}.{w}.weight").t() for e in range(E)])
    return MixtralForCausalLM(cfg), names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=sorted(SHAPES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    import transformers
    from safetensors.torch import save_file
    torch.manual_seed(a.seed)
    shapes = SHAPES[a.family]
    model, names = {"llama": llama, "mixtral": mixtral}[a.family](shapes)
    model = model.double()
    with torch.no_grad():  # the weights hpdl starts from are fp32: compute with those
        for p in model.parameters():
            p.copy_(p.float().double())
    T, B, V = shapes["seq"], a.batch, shapes["vocab"]
    stream = torch.randint(0, V, (B * T + 1,), generator=torch.Generator().manual_seed(a.seed + 1))
    tokens = torch.stack([stream[b * T:b * T + T] for b in range(B)])
    targets = torch.stack([stream[b * T + 1:b * T + T + 1] for b in range(B)])
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
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
    missing = set(params) - used
    if missing:
        sys.exit(f"hf_oracle: no hpdl name for {sorted(missing)}")
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, a.family)
    save_file(out, base + ".safetensors")
    toks = [int(t) for t in stream]
    with open(base + ".bin", "wb") as f:  # hpdl-data's format: 256 int32 header, uint16 tokens
        f.write(struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1012) + struct.pack(f"<{len(toks)}H", *toks))
    meta = {"sample": f"samples/{a.family}.hpd", "defines": shapes, "batch": B, "loss": float(loss),
            "transformers": transformers.__version__, "torch": torch.__version__, "seed": a.seed,
            "what": "loss: mean cross-entropy over every position, fp64 on the fp32 weights; grad.NAME: its gradients"}
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{base}.safetensors: {len(names)} weights and their gradients; loss {float(loss):.10f}")


if __name__ == "__main__":
    main()
