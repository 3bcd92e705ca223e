#!/usr/bin/env python3
"""torch_resnet.py - the baseline of bench/cpu_bench.sh's convolutional row:
samples/resnet18.hpd (std/vision's ResNet, torchvision's resnet18 layer for
layer) trained in PyTorch eager mode on the CPU, timed per step.

    python3 bench/torch_resnet.py [--batch 16] [--threads 2] [--steps 5] [--width 64]
                                  [--stem imagenet|cifar] [--classes 10] [--size 32]

The model: a 7x7 stride-2 stem with 3x3 max pooling (`--stem imagenet`, the
sample's default) or one 3x3 convolution (`cifar`), batch norm and ReLU;
four stages of two basic blocks (3x3 conv, BN, ReLU, 3x3 conv, BN, the
shortcut a strided 1x1 convolution and BN when the shape changes) at widths
w, 2w, 4w, 8w; global average pooling; a linear classifier; mean
cross-entropy. Convolutions have no bias; batch norm in training mode. SGD
with momentum 0.9 and lr 0.1, weight decay 5e-4 (the sample's train block).
Everything fp32, NCHW, torch.set_num_threads(--threads).

Prints one JSON line: {"ms_per_step": median over the timed steps, ...}.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class ResNet18(nn.Module):
    def __init__(self, width, classes, stem):
        super().__init__()
        self.stem = stem
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False) if stem == "imagenet" else nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        blocks, c = [], width
        for i, w in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [BasicBlock(c, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(8 * width, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.stem == "imagenet":
            x = F.max_pool2d(x, 3, 2, 1)
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--stem", default="imagenet", choices=["imagenet", "cifar"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = ResNet18(a.width, a.classes, a.stem)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.rand(a.batch, 3, a.size, a.size) - 0.5
    y = torch.randint(0, a.classes, (a.batch,))
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"ms_per_step": 1e3 * statistics.median(times), "batch": a.batch, "threads": a.threads,
                      "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
