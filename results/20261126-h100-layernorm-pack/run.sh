#!/bin/bash
# norm.cu's two copies of the row loop (4 columns a step, and 1 for rows whose length is
# not a multiple of 4) folded into one template over the width: GPU tests (MiniLM's
# skipped: its weights and these binaries exceed one call's carry) and bench --split,
# the binaries before (.gpu/dcf5619, `make gpu-bundle` at dcf5619) and after (this
# folder's commit) alternated.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head
grep -E "add_layer_norm" $OUT/test-gpu.log | head -30
for rep in 1 2 3; do
  for b in before after; do
    bin=.gpu/gpushare-workload; [ $b = before ] && bin=.gpu/dcf5619/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 90 $bin bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|layernorm|^exit" $OUT/bench-workload.log
