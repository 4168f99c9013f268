#!/bin/bash
# GPU session 2026-11-26 (H100 asked for): every kernel of ours launched with programmatic
# stream serialization and waiting for the prior grid in its first instruction (new,
# `make gpu-bundle` at this folder's commit) against the same kernels launched plainly
# (.gpu/prev36/gpushare-workload: stop 36's bundle, 5310cf4). Then the GPU tests, the split,
# and `make bench-peer` with PyTorch's CUDA-graph runner and rounds. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head -20
for rep in 1 2 3 4; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev36/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 120 $bin bench --models yolos-small --precisions tf32,bf16 --iters 500 >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|^exit" $OUT/bench-workload.log
timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions bf16 --iters 300 --split > $OUT/bench-split.log 2>&1; echo "exit $?" >> $OUT/bench-split.log
grep -E "yolos|gemm  |attention  |layernorm  |elementwise  |sum of|^exit" $OUT/bench-split.log
timeout 400 make bench-peer BUNDLE=$OUT/peer WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer.log 2>&1; echo "exit $?" >> $OUT/bench-peer.log
tail -8 $OUT/bench-peer.log
