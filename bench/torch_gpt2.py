#!/usr/bin/env python3
"""torch_gpt2.py - the baseline of bench/cpu_bench.sh: samples/gpt2.hpd trained
in PyTorch eager mode on the CPU, timed per step.

    python3 bench/torch_gpt2.py [--batch 4] [--seq 64] [--threads 2] [--steps 5]
                                [--layers 12] [--width 768] [--heads 12] [--vocab 50257]

The model is the one hpdlc compiles from samples/gpt2.hpd (stdlib/blocks.hpd,
attention.hpd, mlp.hpd, layers.hpd): learned token and position embeddings
(the position table has --seq rows, as `-D T=...` gives the .hpd model);
pre-LN blocks x = x + attn(ln1(x)); x = x + mlp(ln2(x)); separate q, k, v and
output projections with biases; scores scaled by 1/sqrt(head_dim), causal
mask, softmax; MLP fc -> GELU (tanh approximation) -> proj, width 4C;
LayerNorm eps 1e-5 with weight and bias; a final LayerNorm; logits against
the tied token embedding; mean cross-entropy. Training as the .hpd train
block: AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices and embeddings only, as hpdlrun), gradient clipping at norm 1.0.
Everything fp32 (or, with --precision bf16, the forward under torch.autocast
on bfloat16), torch.set_num_threads(--threads).

Prints one JSON line: {"ms_per_step": median over the timed steps, ...}.
The first --warmup steps are not timed (allocator and thread-pool start-up).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h, layers):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.q_proj = nn.Linear(c, c)
        self.k_proj = nn.Linear(c, c)
        self.v_proj = nn.Linear(c, c)
        self.o_proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.fc):
            nn.init.normal_(lin.weight, 0.0, 0.02)
            nn.init.zeros_(lin.bias)
        for lin in (self.o_proj, self.proj):  # GPT-2's scaled residual init
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * layers))
            nn.init.zeros_(lin.bias)

    def forward(self, x, mask):
        b, t, c = x.shape
        d = c // self.h
        a = self.ln1(x)
        q = self.q_proj(a).view(b, t, self.h, d).transpose(1, 2)
        k = self.k_proj(a).view(b, t, self.h, d).transpose(1, 2)
        v = self.v_proj(a).view(b, t, self.h, d).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.o_proj(y)
        x = x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT2(nn.Module):
    def __init__(self, vocab, seq, c, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(c, heads, layers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))
        self.register_buffer("pos", torch.arange(seq))

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(self.pos)
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: the forward and loss under torch.autocast('cpu', bfloat16), PyTorch's mixed "
                         "precision on the CPU (fp32 weights and optimizer)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = GPT2(args.vocab, args.seq, args.width, args.layers, args.heads)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, 256, (args.batch, args.seq + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(dt)
    print(json.dumps({
        "ms_per_step": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "batch": args.batch, "seq": args.seq,
        "loss_first": losses[0], "loss_last": losses[-1],
        "torch": torch.__version__, "precision": args.precision,
    }))


if __name__ == "__main__":
    main()
