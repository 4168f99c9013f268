"""Prints gpushare-workload against PyTorch per precision, from two JSON-lines files
(ours: `gpushare-workload bench --json`, theirs: pytorch_peer.py).

Columns: our mean; PyTorch eager's mean and our ratio to it; the lowest and highest
ratio over PyTorch's rounds (how far PyTorch moved within the run); PyTorch's mean with
its forward replayed as a CUDA graph, and our ratio to that; under
torch.compile(mode="max-autotune"), and our ratio to that; then PyTorch's fastest runner
of the precision and our ratio to it, the reference for the workload's speed. A runner
missing from the file, or one that could not run, shows "-" (with its error below the
table); each compiled runner's compile time follows the table.

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
    """The printed lines: header, one row per precision both sides have, then errors and
    compile times."""
    lines = [
        f"{'precision':<10} {'ours_ms':>8} {'eager_ms':>9} {'ratio':>6} {'ratio_rounds':>13}"
        f" {'graphed_ms':>11} {'ratio':>6} {'autotune_ms':>12} {'ratio':>6} {'fastest':>12} {'ratio':>6}  device"
    ]
    notes = []

    def timed(r, p):
        """The runner's mean, or None (its error noted)."""
        if r is None:
            return None
        if "mean_ms" in r:
            return r["mean_ms"]
        if "error" in r:
            notes.append(f"{r['runner']} {p}: {r['error']}")
        return None

    for p in PRECISIONS:
        mine = next((r for (_, q), r in ours.items() if q == p), None)
        eager = theirs.get(("pytorch-eager", p))
        runners = {name: theirs.get((f"pytorch-{name}", p)) for name in ("eager", "cuda-graph", "max-autotune")}
        if mine is None or eager is None or "mean_ms" not in eager:
            for r in runners.values():
                timed(r, p)
            continue
        o = mine["mean_ms"]
        means = {name: timed(r, p) for name, r in runners.items()}
        rounds = eager.get("round_means_ms") or []
        spread = f"{o / max(rounds):.3f}-{o / min(rounds):.3f}" if rounds else "-"

        def cols(m, width):
            return f"{m:>{width}.3f} {o / m:>6.3f}" if m is not None else f"{'-':>{width}} {'-':>6}"

        fastest = min((m, name) for name, m in means.items() if m is not None)
        lines.append(
            f"{p:<10} {o:>8.3f} {means['eager']:>9.3f} {o / means['eager']:>6.3f} {spread:>13}"
            f" {cols(means['cuda-graph'], 11)} {cols(means['max-autotune'], 12)}"
            f" {fastest[1]:>12} {o / fastest[0]:>6.3f}  {mine['device_name']}"
        )
        for name, r in runners.items():
            if r is not None and "compile_s" in r:
                notes.append(f"pytorch-{name} {p}: compiled in {r['compile_s']:.1f} s")
    return lines + notes


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
