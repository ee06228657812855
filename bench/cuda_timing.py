"""CUDA-event timing for the PyTorch peers (bench/gpu_peers.py, bench/attention_gpu_peers.py)."""
import statistics

import torch


def timed(fn, iterations=10, repetitions=9):
    """Seconds per call of fn: the median over `repetitions` CUDA-event-timed runs of `iterations`
    calls each, after one untimed call (warm-up, compilation)."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repetitions):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3 / iterations)
    return statistics.median(samples)
