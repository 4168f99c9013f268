"""PyTorch eager peer of gpushare-workload's yolos-small, for `make bench-peer`.

Builds transformers' YolosForObjectDetection with the reference study's shape
(hidden 384, 12 layers, 6 heads, MLP 1536, 100 detection tokens, 91 classes,
800x1066 input) and random weights, then times batch-1 inference the way a user's
eager PyTorch server would run it: one forward pass and a synchronize per inference.
Prints one JSON line per precision on stdout.

Usage: python pytorch_peer.py [--precisions fp32,tf32,bf16] [--iters 200] [--warmup 20]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import transformers

# The model is the example server's (workload/examples/pytorch/model.py): one definition.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "pytorch"))
from model import build  # noqa: E402


def measure(precision: str, iters: int, warmup: int) -> dict:
    model, pixels, config = build(precision)
    with torch.inference_mode():
        for _ in range(warmup):
            model(pixel_values=pixels)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            out = model(pixel_values=pixels)
            out.logits.float().cpu()  # the result reaches the host, as ours does
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "runner": "pytorch-eager",
        "model": "yolos-small",
        "precision": precision,
        "batch": 1,
        "iters": iters,
        "mean_ms": statistics.fmean(times),
        "p50_ms": times[len(times) // 2],
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
        "device_name": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": getattr(config, "_attn_implementation", "?"),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
    for precision in a.precisions.split(","):
        print(json.dumps(measure(precision, a.iters, a.warmup)), flush=True)


if __name__ == "__main__":
    main()
