#!/bin/bash
# Call 3: in call 2 bf16 was slower with programmatic launch when it ran after TF32 in
# one process (bench --precisions tf32,bf16) but faster in a process of its own (the
# split runs). A server runs one precision, so: bf16 alone per process, the three
# binaries of call 2 alternated five times, 1000 inferences each; then TF32 alone, three
# times. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-3.csv
cat $OUT/gpu-3.csv
for p in bf16 bf16 bf16 bf16 bf16 tf32 tf32 tf32; do
  for b in prev36 pdl-all pdl-noattn; do
    echo "== $b $p" >> $OUT/bench-workload-3.log
    timeout 120 .gpu/$b/gpushare-workload bench --models yolos-small --precisions $p --iters 1000 >> $OUT/bench-workload-3.log 2>&1; echo "exit $?" >> $OUT/bench-workload-3.log
  done
done
grep -E "^==|yolos|^exit" $OUT/bench-workload-3.log | paste - - - | awk '{print $2, $3, $9, $10, $11}'
