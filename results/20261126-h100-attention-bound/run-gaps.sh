#!/bin/bash
# (Caches are not flushed between kernels: --cache-control none, as in a real pass.)
# Where do the ~80 µs between the bf16 pass's kernel sum (bench --split) and its mean
# per inference go? Nsight Compute (--clock-control none, reads only):
#  1. each graph launch profiled whole (--graph-profiling graph): the pass's GPU time,
#     gaps between its kernels included;
#  2. every kernel profiled alone (--graph-profiling node), for runs of 1 and 2 inferences:
#     the second run's extra kernels are one pass's, each timed alone.
# Then bench (wall time per inference: graph launch, the pass, the output's copy back).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
W=.gpu/prev35/gpushare-workload # stop 35's bundle: the code at HEAD of this session
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-gaps.csv
cat $OUT/gpu-gaps.csv
B="bench --models yolos-small --precisions bf16 --warmup 0"
timeout 200 ncu --clock-control none --cache-control none --graph-profiling graph --metrics gpu__time_duration.sum --csv $W $B --iters 5 > $OUT/ncu-graph.csv 2>$OUT/ncu-graph.err; echo "graph exit $?"
for n in 1 2; do
  timeout 200 ncu --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv $W $B --iters $n > $OUT/ncu-nodes-$n.csv 2>$OUT/ncu-nodes-$n.err; echo "nodes $n exit $?"
done
timeout 60 $W bench --models yolos-small --precisions bf16 --warmup 20 --iters 300 | tee $OUT/bench-gaps.log
python3 - "$OUT" <<'PY'
import csv, sys, io
out = sys.argv[1]
def rows(path):
    text = open(path).read()
    i = text.find('"ID"')
    return list(csv.DictReader(io.StringIO(text[i:]))) if i >= 0 else []
def dur_us(r):
    v = float(r["Metric Value"].replace(",", ""))
    u = r["Metric Unit"]
    return {"ns": v / 1e3, "nsecond": v / 1e3, "us": v, "usecond": v, "ms": v * 1e3, "msecond": v * 1e3}[u]
g = [r for r in rows(f"{out}/ncu-graph.csv") if r["Metric Name"] == "gpu__time_duration.sum"]
print("graph launches profiled:", len(g), "the last five (the timed passes), GPU time each (us):", [round(dur_us(r), 1) for r in g[-5:]])
n1 = [r for r in rows(f"{out}/ncu-nodes-1.csv") if r["Metric Name"] == "gpu__time_duration.sum"]
n2 = [r for r in rows(f"{out}/ncu-nodes-2.csv") if r["Metric Name"] == "gpu__time_duration.sum"]
k = len(n2) - len(n1)
last = n2[-k:] if k > 0 else []
print(f"kernels: run of 1 {len(n1)}, run of 2 {len(n2)}: {k} a pass; their sum alone {sum(map(dur_us, last)):.1f} us")
by = {}
for r in last:
    name = r["Kernel Name"].split("(")[0][:60]
    by.setdefault(name, [0, 0.0])
    by[name][0] += 1
    by[name][1] += dur_us(r)
for name, (c, t) in sorted(by.items(), key=lambda x: -x[1][1]):
    print(f"  {c:4d} x {name:60s} {t:8.1f} us")
PY
