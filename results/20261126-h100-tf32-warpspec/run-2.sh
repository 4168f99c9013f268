#!/bin/bash
# The second call (an H200 asked for; gpu-2.csv names the card): run.sh again, with the new
# bundle made at 0ebd15b (run.sh's kernels, and bench --split's rows per product site), and
# the driver with the staged-output and rounded-K variants.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-2.csv
cat $OUT/gpu-2.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu-2.log 2>&1; echo "exit $?" >> $OUT/test-gpu-2.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu-2.log | head -20
grep -E "attention (Bf16|Tf32) " $OUT/test-gpu-2.log | head -12
for b in prev new; do
  bin=.gpu/workload-kernel-bench; [ $b = prev ] && bin=.gpu/prev34/workload-kernel-bench
  echo "== $b ($bin)" >> $OUT/bench-attention-2.log
  timeout 150 $bin --bench 'gpu/attention (bf16|tf32)' >> $OUT/bench-attention-2.log 2>&1; echo "exit $?" >> $OUT/bench-attention-2.log
done
grep -E '^==|^gpu/|time:|thrpt:|^exit' $OUT/bench-attention-2.log
for rep in 1 2; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev34/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload-2.log
    timeout 90 $bin bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload-2.log 2>&1; echo "exit $?" >> $OUT/bench-workload-2.log
  done
done
grep -E "^==|yolos|gemm  |gemm [a-z]|attention  |^exit" $OUT/bench-workload-2.log
timeout 200 bash results/20261126-h100-tf32-warpspec/drivers/run.sh > $OUT/driver-2.log 2>&1; echo "exit $?" >> $OUT/driver-2.log
grep -E "3401|TIME (base|kept|ws128)|exit" $OUT/driver-2.log
timeout 300 make bench-peer BUNDLE=$OUT/peer-2 WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer-2.log 2>&1; echo "exit $?" >> $OUT/bench-peer-2.log
tail -12 $OUT/bench-peer-2.log
