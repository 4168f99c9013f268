"""Prints gpushare-workload against PyTorch per precision, from two JSON-lines files
(ours: `gpushare-workload bench --json`, theirs: pytorch_peer.py).

Columns: our mean; PyTorch eager's mean and our ratio to it; the lowest and highest
ratio over PyTorch's rounds (how far PyTorch moved within the run); PyTorch's mean with
its forward replayed as a CUDA graph, and our ratio to that. A runner missing from the
file, or one that could not run, shows "-" (with its error below the table).

Usage: python compare_peer.py OURS.jsonl PYTORCH.jsonl
"""

import json
import sys

PRECISIONS = ("fp32", "tf32", "bf16")


def load(path):
    """{(runner, precision): record} of the file's yolos-small batch-1 lines."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"compare_peer: {path} line {n}: not JSON ({e})")
            if r.get("model") == "yolos-small" and r.get("batch") == 1 and "precision" in r:
                out[(r.get("runner", "ours"), r["precision"])] = r
    return out


def table(ours, theirs):
    """The printed lines: header, one row per precision both sides have, then errors."""
    lines = [
        f"{'precision':<10} {'ours_ms':>8} {'eager_ms':>9} {'ratio':>6} {'ratio_rounds':>13}"
        f" {'graphed_ms':>11} {'ratio':>6}  device"
    ]
    errors = []
    for p in PRECISIONS:
        mine = next((r for (_, q), r in ours.items() if q == p), None)
        eager = theirs.get(("pytorch-eager", p))
        graphed = theirs.get(("pytorch-cuda-graph", p))
        if mine is None or eager is None or "mean_ms" not in eager:
            for r in (eager, graphed):
                if r is not None and "error" in r:
                    errors.append(f"{r['runner']} {p}: {r['error']}")
            continue
        o, t = mine["mean_ms"], eager["mean_ms"]
        rounds = eager.get("round_means_ms") or []
        spread = f"{o / max(rounds):.3f}-{o / min(rounds):.3f}" if rounds else "-"
        if graphed is not None and "mean_ms" in graphed:
            g = graphed["mean_ms"]
            gcols = f"{g:>11.3f} {o / g:>6.3f}"
        else:
            gcols = f"{'-':>11} {'-':>6}"
            if graphed is not None and "error" in graphed:
                errors.append(f"pytorch-cuda-graph {p}: {graphed['error']}")
        lines.append(f"{p:<10} {o:>8.3f} {t:>9.3f} {o / t:>6.3f} {spread:>13} {gcols}  {mine['device_name']}")
    return lines + errors


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: compare_peer.py OURS.jsonl PYTORCH.jsonl")
    try:
        ours, theirs = load(sys.argv[1]), load(sys.argv[2])
    except OSError as e:
        sys.exit(f"compare_peer: {e}")
    try:
        lines = table(ours, theirs)
    except KeyError as e:
        sys.exit(f"compare_peer: a record lacks the field {e}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
