#!/bin/bash
# After the review's fixes (the copy's wait by the driver, the capture's error order, the
# tuner timing candidates eagerly under --no-graph, uncapturable candidates passed over):
# the GPU tests and bench, graph and eager, with this commit's bundle. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-4.csv
cat $OUT/gpu-4.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu-4.log 2>&1; echo "exit $?" >> $OUT/test-gpu-4.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu-4.log | head -20
for rep in 1 2; do
  timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions tf32,bf16 --iters 500 >> $OUT/bench-4.log 2>&1; echo "exit $?" >> $OUT/bench-4.log
  timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions bf16 --iters 200 --no-graph >> $OUT/bench-4.log 2>&1; echo "exit $? (--no-graph)" >> $OUT/bench-4.log
done
grep -E "yolos|^exit" $OUT/bench-4.log
