"""Prints gpushare-workload vs PyTorch eager latency per precision, from two JSON-lines
files (ours: `gpushare-workload bench --json`, theirs: pytorch_peer.py).

Usage: python compare_peer.py OURS.jsonl PYTORCH.jsonl
"""

import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        rows = (json.loads(line) for line in f if line.strip())
        return {r["precision"]: r for r in rows if r["model"] == "yolos-small" and r["batch"] == 1}


def main() -> None:
    ours, theirs = load(sys.argv[1]), load(sys.argv[2])
    print(f"{'precision':<10} {'ours_ms':>9} {'pytorch_ms':>11} {'ratio':>7}  device")
    for p in ("fp32", "tf32", "bf16"):
        if p in ours and p in theirs:
            o, t = ours[p]["mean_ms"], theirs[p]["mean_ms"]
            print(f"{p:<10} {o:>9.3f} {t:>11.3f} {o / t:>7.3f}  {ours[p]['device_name']}")


if __name__ == "__main__":
    main()
