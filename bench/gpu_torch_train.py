#!/usr/bin/env python3
"""gpu_torch_train.py - the baseline of bench/gpu_train_bench.sh: GPT-2 124M
(Hugging Face transformers' GPT2LMHeadModel, the model of samples/gpt2.hpd:
vocab 50257, context 1024, width 768, 12 layers, 12 heads, tied head)
trained on one GPU with the newest PyTorch as hpdlrun trains it: MICRO x 1024
tokens a micro-batch, ACCUM micro-batches a step, the gradients' norm clipped
to 1, fused AdamW (lr 6e-4, betas 0.9 / 0.95, weight decay 0.1 on the
matrices and embeddings). The whole step is timed (mean of --steps after 3
of warm-up), tokens a second printed.

Variants: bf16 (torch.autocast to bfloat16, fp32 master weights, SDPA
attention), the same under torch.compile (--compile), and TF32 GEMMs in fp32."""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def run(micro, accum, seq, steps, mode, compiled):
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).cuda().float().train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if compiled else model
    xs = [torch.randint(0, 50257, (micro, seq), device="cuda") for _ in range(accum)]

    def step():
        opt.zero_grad(set_to_none=True)
        for x in xs:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = fwd(input_ids=x, labels=x).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    name = f"{mode}{' compiled' if compiled else ''}"
    print(f"torch {torch.__version__} {name:14s}: {mean*1e3:8.1f} ms a step (best {min(times)*1e3:.1f}, warm-up {warm:.0f} s), "
          f"{micro*accum*seq/mean:8.0f} tokens/s, peak {peak:.2f} GiB, loss {loss.item() * accum:.4f}", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default="bf16,tf32", help="of bf16, tf32, fp32")
    ap.add_argument("--compile", action="store_true", help="bf16 under torch.compile too")
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; {a.micro} x {a.accum} x {a.seq} tokens a step", flush=True)
    for mode in filter(None, a.modes.split(",")):
        run(a.micro, a.accum, a.seq, a.steps, mode, False)
    if a.compile:
        run(a.micro, a.accum, a.seq, a.steps, "bf16", True)


if __name__ == "__main__":
    main()
