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
import statistics
import time

import torch
import transformers
from transformers import YolosConfig, YolosForObjectDetection


def build(precision: str):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    config = YolosConfig(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=[800, 1066],
        num_detection_tokens=100,
        num_labels=91,
        # As in hustvl/yolos-small and our model: position embeddings at the input only.
        use_mid_position_embeddings=False,
    )
    torch.manual_seed(0)
    model = YolosForObjectDetection(config).cuda().eval()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = model.to(dtype)
    pixels = torch.randn(1, 3, 800, 1066, device="cuda", dtype=dtype)
    return model, pixels, config


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
