#!/bin/bash
# K by TMA in the TF32 wgmma attention: GPU tests (MiniLM's skipped: its weights and these
# binaries exceed what the device tool carries at once), criterion attention benches and
# bench --split, old (.gpu/prev, stop 33's bundle) and new (`make gpu-bundle` at this
# folder's commit) binaries alternated.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head -20
grep -E "attention (Bf16|Tf32) " $OUT/test-gpu.log | head -20
for b in prev new; do
  bin=.gpu/workload-kernel-bench; [ $b = prev ] && bin=.gpu/prev/workload-kernel-bench
  echo "== $b ($bin)" >> $OUT/bench-attention.log
  timeout 150 $bin --bench 'gpu/attention (bf16|tf32) \(' >> $OUT/bench-attention.log 2>&1; echo "exit $?" >> $OUT/bench-attention.log
done
grep -E '^==|^gpu/|time:|^exit' $OUT/bench-attention.log
for rep in 1 2 3; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 90 $bin bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|attention  |^exit" $OUT/bench-workload.log
