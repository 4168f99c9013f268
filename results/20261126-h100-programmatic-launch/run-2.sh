#!/bin/bash
# Call 2: bf16 did not gain from programmatic launch in call 1 (TF32 did). Three binaries
# alternated on one H100: stop 36's (.gpu/prev36), every kernel launched programmatically
# (.gpu/pdl-all, this folder's call-1 binary), and every kernel but the attention
# (.gpu/pdl-noattn: the attention kernels without the wait and launched plainly, built
# from this commit with those two edits), then the split of each. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-2.csv
cat $OUT/gpu-2.csv
for rep in 1 2 3 4; do
  for b in prev36 pdl-all pdl-noattn; do
    echo "== $b rep $rep" >> $OUT/bench-workload-2.log
    timeout 120 .gpu/$b/gpushare-workload bench --models yolos-small --precisions tf32,bf16 --iters 500 >> $OUT/bench-workload-2.log 2>&1; echo "exit $?" >> $OUT/bench-workload-2.log
  done
done
grep -E "^==|yolos|^exit" $OUT/bench-workload-2.log
for b in prev36 pdl-all pdl-noattn; do
  echo "== $b split" >> $OUT/bench-split-2.log
  timeout 120 .gpu/$b/gpushare-workload bench --models yolos-small --precisions bf16 --iters 300 --split >> $OUT/bench-split-2.log 2>&1; echo "exit $?" >> $OUT/bench-split-2.log
done
grep -E "^==|yolos|gemm  |attention  |layernorm  |elementwise  |sum of|^exit" $OUT/bench-split-2.log
