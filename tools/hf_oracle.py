#!/usr/bin/env python3
"""hf_oracle.py - goldens from Hugging Face `transformers` for hpdl's samples (issue 19).

For a family (llama), builds a tiny random configuration with `transformers`, rounds its
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


def llama(shapes):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], intermediate_size=shapes["ffn"],
                      num_hidden_layers=shapes["layers"], num_attention_heads=shapes["heads"],
                      num_key_value_heads=shapes["kv_heads"], max_position_embeddings=shapes["seq"],
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, initializer_range=0.2)
    model = LlamaForCausalLM(cfg)
    # hpdl name -> (Hugging Face name, transposed); q and k are also permuted (rope_cols)
    names = {"embed.weight": ("model.embed_tokens.weight", False), "norm.weight": ("model.norm.weight", False),
             "head.weight": ("lm_head.weight", True)}
    for i in range(shapes["layers"]):
        p, h = f"blocks.{i}.", f"model.layers.{i}."
        names[p + "ln1.weight"] = (h + "input_layernorm.weight", False)
        names[p + "ln2.weight"] = (h + "post_attention_layernorm.weight", False)
        for x in ("q", "k", "v", "o"):
            names[p + f"attn.{x}_proj.weight"] = (h + f"self_attn.{x}_proj.weight", True)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            names[p + f"mlp.{ours}.weight"] = (h + f"mlp.{theirs}.weight", True)
    return model, names


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
    model, names = {"llama": llama}[a.family](shapes)
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
    out = {}
    D = shapes["hidden"] // shapes["heads"]
    for ours, (theirs, transposed) in names.items():
        w, g = params[theirs].detach(), params[theirs].grad.detach()
        if transposed:
            w, g = w.t(), g.t()
        if ours.endswith(("attn.q_proj.weight", "attn.k_proj.weight")):
            w, g = rope_cols(w, D), rope_cols(g, D)
        out[ours] = w.float().contiguous()
        out["grad." + ours] = g.float().contiguous()
    missing = set(params) - {t for t, _ in names.values()}
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
