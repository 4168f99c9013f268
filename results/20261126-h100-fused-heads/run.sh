#!/bin/bash
# GPU session 2026-11-26 (H100 asked for): the detection heads as three products instead
# of six (new, `make gpu-bundle` at this folder's commit) against programmatic launch
# alone (.gpu/pdl-all: results/20261126-h100-programmatic-launch's binary, 463c878) and
# stop 36's bundle (.gpu/prev36, 5310cf4). GPU tests; one precision per process, the
# three alternated (bf16 5x, TF32 3x, 1000 inferences each); the split; `make bench-peer`.
# Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real|yolos|tiny" $OUT/test-gpu.log | head -30
mkdir -p .gpu/new && cp .gpu/gpushare-workload .gpu/new/
for p in bf16 bf16 bf16 bf16 bf16 tf32 tf32 tf32; do
  for b in prev36 pdl-all new; do
    echo "== $b $p" >> $OUT/bench-workload.log
    timeout 120 .gpu/$b/gpushare-workload bench --models yolos-small --precisions $p --iters 1000 >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|^exit" $OUT/bench-workload.log | paste - - - | awk '{print $2, $3, "mean", $8, "p50", $9}'
timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions bf16 --iters 300 --split > $OUT/bench-split.log 2>&1; echo "exit $?" >> $OUT/bench-split.log
grep -E "yolos|gemm  |attention  |layernorm  |elementwise  |sum of|head|^exit" $OUT/bench-split.log
timeout 400 make bench-peer BUNDLE=$OUT/peer WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer.log 2>&1; echo "exit $?" >> $OUT/bench-peer.log
tail -6 $OUT/bench-peer.log
