#!/usr/bin/env python3
"""gpu_torch_gpt2.py - the baseline of bench/gpu_bench.sh: GPT-2 124M
(Hugging Face transformers' GPT2LMHeadModel, the model of samples/gpt2.hpd:
vocab 50257, context 1024, width 768, 12 layers, 12 heads, tied head) one
forward + backward in fp32 on one GPU with the newest PyTorch, timed as
test_device --bench times ours: no optimizer, gradients zeroed each step.

Prints one line per variant: eager with the math attention (scores
materialised, as our kernels do today), eager with PyTorch's SDPA
(memory-efficient attention), each with fp32 and with TF32 GEMMs."""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def run(micro, seq, steps, attn, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).cuda().float().train()
    assert model.config._attn_implementation == attn
    x = torch.randint(0, 50257, (micro, seq), device="cuda")
    def step():
        model.zero_grad(set_to_none=False)
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        return out.loss
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch {torch.__version__} {attn:5s} {'tf32' if tf32 else 'fp32'}: forward+backward {mean*1e3:.2f} ms a step "
          f"(mean of {steps}, best {min(times)*1e3:.2f}), {micro*seq/mean:.0f} tokens/s, peak {peak:.2f} GiB")
    del model
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    for attn in ("eager", "sdpa"):
        for tf32 in (False, True):
            run(a.micro, a.seq, a.steps, attn, tf32)


if __name__ == "__main__":
    main()
