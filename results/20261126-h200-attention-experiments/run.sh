#!/bin/bash
# GPU session 2026-11-26: raw-max softmax + finish_rows + 32 GEMM candidates; experiments.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head -20
grep -E "attention (Bf16|Tf32) " $OUT/test-gpu.log | head -12
timeout 150 .gpu/workload-kernel-bench --bench 'gpu/attention (bf16|tf32)' > $OUT/bench-attention.log 2>&1; echo "exit $?" >> $OUT/bench-attention.log
grep -E '^gpu/|time:|thrpt:|^exit' $OUT/bench-attention.log
for rep in 1 2; do
  for b in head new; do
    bin=.gpu/gpushare-workload; [ $b = head ] && bin=.gpu/head/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 90 $bin bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|gemm  |attention  |^exit" $OUT/bench-workload.log
timeout 120 bash .gpu/dbg3/run.sh > $OUT/streamk.log 2>&1; echo "exit $?" >> $OUT/streamk.log
grep TIME $OUT/streamk.log | tail -8
timeout 60 bash .gpu/dbg3/run2.sh > $OUT/softmax-variants.log 2>&1; echo "exit $?" >> $OUT/softmax-variants.log
grep -E "ACC|TIME" $OUT/softmax-variants.log
