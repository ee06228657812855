#!/usr/bin/env python3
"""PyTorch on the GPU on bench/gpu_bench.cpp's cases: the device-to-device copy, the fused
relu(a*b+c)*0.5+d over 64M f32 (eager and torch.compile), sgemm 4096^3 in f32 (TF32 off), the
20-op function's call time, and the MNIST MLP step (784-700-500-10, ReLU, Adam) at batch 128
and 4096. Times are medians of CUDA-event-timed repetitions after warm-up.
Usage (on the GPU machine): python3 bench/gpu_peers.py"""
import torch

from cuda_timing import timed  # bench/cuda_timing.py

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")


def row(label, seconds, extra=""):
    print(f"{label:<52} {seconds * 1e3:9.3f} ms  {extra}")


n = 1 << 26
src = torch.rand(n, device=dev)
dst = torch.empty_like(src)
copy = timed(lambda: dst.copy_(src), 20)
copy_gbs = 2 * n * 4 / copy / 1e9
row("torch: device-to-device copy, 256 MiB", copy, f"{copy_gbs:7.0f} GB/s")

a, b, c, d = (torch.rand(n, device=dev) for _ in range(4))


def fused(a, b, c, d):
    return torch.relu(a * b + c) * 0.5 + d


eager = timed(lambda: fused(a, b, c, d))
row("torch eager: relu(a*b+c)*0.5+d, 64M f32", eager, f"{5 * n * 4 / eager / 1e9:7.0f} GB/s")
compiled_fn = torch.compile(fused)
compiled = timed(lambda: compiled_fn(a, b, c, d))
row("torch.compile: relu(a*b+c)*0.5+d, 64M f32", compiled, f"{5 * n * 4 / compiled / 1e9:7.0f} GB/s")
del a, b, c, d, src, dst

m = 4096
x, y = torch.rand(m, m, device=dev), torch.rand(m, m, device=dev)
mm = timed(lambda: torch.mm(x, y), 5)
row("torch: sgemm 4096^3 (TF32 off)", mm, f"{2 * m ** 3 / mm / 1e12:7.1f} TFLOP/s")

small = torch.rand(4, 8, device=dev)


def twenty(y):
    for _ in range(5):
        y = (torch.exp(y * 0.5) + y).sum(1, keepdim=True) * y - 1.0
    return y


t = timed(lambda: twenty(small), 200)
print(f"{'torch eager: 20-op function, one call':<52} {t * 1e6:9.1f} us per call")


def mnist_step_seconds(batch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 700), torch.nn.ReLU(), torch.nn.Linear(700, 500), torch.nn.ReLU(),
                                torch.nn.Linear(500, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs = torch.rand(batch, 784, device=dev)
    ys = torch.randint(0, 10, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()

    return timed(step, 20)


for batch in (128, 4096):
    row(f"torch eager: MNIST MLP step (Adam), batch {batch}", mnist_step_seconds(batch))
