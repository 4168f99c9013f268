#!/bin/bash
# GPU session 2026-11-26 (H100 asked for): each inference's output copied back into
# page-locked memory by one async copy and one wait (new, `make gpu-bundle` at this
# folder's commit) against a wait and then a copy into pageable memory
# (.gpu/prev-tuner/gpushare-workload: the bundle of the tuner change, 7f18745). Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head -20
for rep in 1 2 3 4 5; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev-tuner/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 120 $bin bench --models yolos-small,tiny --precisions tf32,bf16 --iters 500 >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|tiny|^exit" $OUT/bench-workload.log
