"""PyTorch peer of gpushare-workload's yolos-small, for `make bench-peer`.

Builds transformers' YolosForObjectDetection with the reference study's shape
(hidden 384, 12 layers, 6 heads, MLP 1536, 100 detection tokens, 91 classes,
800x1066 input) and random weights, then times batch-1 inference three ways:

- pytorch-eager: the way a user's eager PyTorch server runs it, one forward pass and
  the result copied to the host per inference. Eager PyTorch issues every kernel from
  Python, so its time depends on the host's CPU as well as on the GPU.
- pytorch-cuda-graph: the same forward captured once as a CUDA graph
  (torch.cuda.CUDAGraph) and replayed, the result copied to the host the same way.
  This takes the host's launch cost out, as gpushare-workload's graph does; what is
  left is PyTorch's kernels. If the forward cannot be captured, its line carries
  "error" instead of times.
- pytorch-max-autotune: the model under torch.compile(mode="max-autotune"): Inductor's
  fused kernels, its GEMMs autotuned (Triton templates against cuBLAS) and the whole
  replayed as CUDA graphs, PyTorch's fastest mode for a fixed shape. Its line adds
  compile_s, the time its first calls took to compile and tune. A compile that fails
  carries "error".

Attention runs through transformers' SDPA path (torch.nn.functional.
scaled_dot_product_attention, its flash or memory-efficient kernels), the fastest it
offers for this model; each line records it.

Each runner's timed inferences are split into --rounds consecutive rounds, and each
round's mean is printed, so a comparison can state how much PyTorch moved within the
run. Prints one JSON line per runner and precision on stdout.

Usage: python pytorch_peer.py [--precisions fp32,tf32,bf16] [--iters 200] [--warmup 20]
                              [--rounds 5] [--runners eager,cuda-graph,max-autotune]
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

RUNNERS = ("eager", "cuda-graph", "max-autotune")


def summary(times: list, rounds: int) -> dict:
    """Mean, median, p99 and the means of `rounds` consecutive rounds, in ms."""
    per = max(1, len(times) // rounds)
    chunks = [times[i * per : (i + 1) * per] for i in range(min(rounds, len(times)))]
    ordered = sorted(times)
    return {
        "iters": len(times),
        "mean_ms": statistics.fmean(times),
        "p50_ms": ordered[len(ordered) // 2],
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "round_means_ms": [statistics.fmean(c) for c in chunks if c],
    }


def time_runs(run, iters: int, warmup: int) -> list:
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def eager(model, pixels):
    def run():
        out = model(pixel_values=pixels)
        out.logits.float().cpu()  # the result reaches the host, as ours does

    return run


def cuda_graph(model, pixels):
    """The forward captured once; each run replays it and copies the result out."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
            model(pixel_values=pixels)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(pixel_values=pixels)

    def run():
        graph.replay()
        out.logits.float().cpu()

    return run


def max_autotune(model, pixels):
    """The model compiled for this shape; its first calls compile and tune. Returns the
    run and the seconds those calls took."""
    compiled = torch.compile(model, mode="max-autotune")
    t0 = time.perf_counter()
    for _ in range(3):  # compile, then Inductor's CUDA-graph warm-up and recording
        compiled(pixel_values=pixels).logits.float().cpu()
    compile_s = time.perf_counter() - t0

    def run():
        out = compiled(pixel_values=pixels)
        out.logits.float().cpu()

    return run, compile_s


def measure(precision: str, runner: str, iters: int, warmup: int, rounds: int) -> dict:
    model, pixels, config = build(precision)
    line = {
        "runner": f"pytorch-{runner}",
        "model": "yolos-small",
        "precision": precision,
        "batch": 1,
        "device_name": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": getattr(config, "_attn_implementation", "?"),
    }
    with torch.inference_mode():
        if runner == "max-autotune":
            # Inductor fails in many ways (its cache, its CUDA-graph trees, a kernel it
            # cannot tune), while compiling or on a later call: each is this runner's error.
            try:
                run, line["compile_s"] = max_autotune(model, pixels)
                line.update(summary(time_runs(run, iters, warmup), rounds))
            except Exception as e:  # noqa: BLE001
                line["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            return line
        try:
            run = eager(model, pixels) if runner == "eager" else cuda_graph(model, pixels)
        except RuntimeError as e:  # a forward that cannot be captured
            # Ending a failed capture raises again; the first error is the cause.
            first = e.__context__ if isinstance(e.__context__, Exception) else e
            line["error"] = str(first).splitlines()[0] if str(first) else type(first).__name__
            return line
        line.update(summary(time_runs(run, iters, warmup), rounds))
    return line


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--runners", default=",".join(RUNNERS))
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    runners = a.runners.split(",")
    for r in runners:
        if r not in RUNNERS:
            p.error(f"--runners: unknown runner {r!r}; use {', '.join(RUNNERS)}")
    if a.iters < 1 or a.rounds < 1:
        p.error("--iters and --rounds must be at least 1")
    for precision in a.precisions.split(","):
        for runner in runners:
            print(json.dumps(measure(precision, runner, a.iters, a.warmup, a.rounds)), flush=True)


if __name__ == "__main__":
    main()
