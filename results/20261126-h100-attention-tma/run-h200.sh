#!/bin/bash
# The same comparison on an H200: criterion attention benches and bench --split, old
# (.gpu/prev) and new (`make gpu-bundle` at dcf5619) binaries alternated, and the driver.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-h200.csv
cat $OUT/gpu-h200.csv
for b in prev new; do
  bin=.gpu/workload-kernel-bench; [ $b = prev ] && bin=.gpu/prev/workload-kernel-bench
  echo "== $b ($bin)" >> $OUT/bench-attention-h200.log
  timeout 150 $bin --bench 'gpu/attention bf16 \(' >> $OUT/bench-attention-h200.log 2>&1; echo "exit $?" >> $OUT/bench-attention-h200.log
done
grep -E '^==|^gpu/|time:|^exit' $OUT/bench-attention-h200.log
for rep in 1 2; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload-h200.log
    timeout 90 $bin bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload-h200.log 2>&1; echo "exit $?" >> $OUT/bench-workload-h200.log
  done
done
grep -E "^==|yolos|attention  |^exit" $OUT/bench-workload-h200.log
timeout 200 bash results/20261126-h100-attention-tma/drivers/run.sh > $OUT/driver-h200.log 2>&1; echo "exit $?" >> $OUT/driver-h200.log
grep -E "TIME (base|kept|unstaged)|exit" $OUT/driver-h200.log
