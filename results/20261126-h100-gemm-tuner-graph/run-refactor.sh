#!/bin/bash
# After the tuner's and the split's event timing became one helper (time_min_ms): the GPU
# tests, bench with the split (graph timing per step), and bench --no-graph (the tuner
# timing eagerly), with that commit's bundle. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-refactor.csv
cat $OUT/gpu-refactor.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu-refactor.log 2>&1; echo "exit $?" >> $OUT/test-gpu-refactor.log
grep -E "test result|FAILED|panicked|^exit" $OUT/test-gpu-refactor.log | head
timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions tf32,bf16 --iters 300 --split > $OUT/bench-refactor.log 2>&1; echo "exit $?" >> $OUT/bench-refactor.log
timeout 120 .gpu/gpushare-workload bench --models yolos-small --precisions bf16 --iters 200 --no-graph >> $OUT/bench-refactor.log 2>&1; echo "exit $? (--no-graph)" >> $OUT/bench-refactor.log
grep -E "yolos|gemm  |attention  |layernorm  |sum of|^exit" $OUT/bench-refactor.log
