#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the GPU on bench/attention_bench.cpp's GPU cases:
causal self-attention forward + backward (dq, dk, dv) of the sum of out * w, q/k/v in the given
dtype, [batch, heads, T, features]; each backend SDPA has for the dtype (flash, cuDNN,
memory-efficient, math), and the TFLOP/s of the causal work (FlashAttention's count: forward
2 matmuls, backward 5, each 2*T*T*d/2 multiply-adds under the mask). Medians of CUDA-event-timed
repetitions after warm-up.
Usage (on the GPU machine):
  python3 bench/attention_gpu_peers.py --batch 2 --heads 8 --features 128 --dtype bf16 --lengths 1024,4096,8192"""
import argparse

import torch

from cuda_timing import timed  # bench/cuda_timing.py
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--features", type=int, default=128)
parser.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
parser.add_argument("--lengths", default="1024,4096,8192")
args = parser.parse_args()
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32


backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
print(f"torch {torch.__version__}: causal SDPA fwd+bwd, {args.dtype}, {args.batch} x {args.heads} heads x T x {args.features}")
for length in [int(t) for t in args.lengths.split(",")]:
    shape = (args.batch, args.heads, length, args.features)
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    w = torch.randn(shape, device=dev, dtype=torch.float32)
    flops = 3.5 * 4 * args.batch * args.heads * length * length * args.features / 2
    for name, backend in backends:
        def step():
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad((out.float() * w).sum(), (q, k, v))
        try:
            seconds = timed(step, 5, 7)
        except RuntimeError as error:  # a backend that cannot run this dtype or size
            print(f"T={length:<6} {name:<10} not run: {str(error).splitlines()[0][:90]}")
            torch.cuda.empty_cache()
            continue
        print(f"T={length:<6} {name:<10} {seconds * 1e3:9.3f} ms  {flops / seconds / 1e12:7.1f} TFLOP/s")
        torch.cuda.empty_cache()
