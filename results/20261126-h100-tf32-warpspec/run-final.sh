#!/bin/bash
# The last call: every GPU test but MiniLM's (its weights and this checkout exceed what the
# device tool carries; run-minilm.sh ran it at 0ebd15b) and bench --split with the bundle made
# at the stop's final code (3736190), after the refactors from the last read of the change.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-final.csv
cat $OUT/gpu-final.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu-final.log 2>&1; echo "exit $?" >> $OUT/test-gpu-final.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu-final.log | head -20
grep -E "attention (Bf16|Tf32) |minilm" $OUT/test-gpu-final.log | head -20
for rep in 1 2; do
  echo "== rep $rep" >> $OUT/bench-workload-final.log
  timeout 90 .gpu/gpushare-workload bench --models yolos-small --precisions tf32,bf16 --iters 300 --split >> $OUT/bench-workload-final.log 2>&1; echo "exit $?" >> $OUT/bench-workload-final.log
done
cat $OUT/bench-workload-final.log
