#!/bin/bash
# GPU session 2026-11-26 (H100 asked for): the bf16 wgmma attention with its row sums on
# the tensor core (new, `make gpu-bundle` at this folder's commit) against the kernel
# before (.gpu/prev34/workload-kernel-bench: criterion, the same bf16 kernel as stop 35's;
# .gpu/prev35/gpushare-workload: stop 35's bundle for `bench`). Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( time timeout 300 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture --skip minilm ) > $OUT/test-gpu.log 2>&1; echo "exit $?" >> $OUT/test-gpu.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu.log | head -20
grep -E "attention (Bf16|Tf32) " $OUT/test-gpu.log | head -12
for rep in 1 2; do
  for b in prev new; do
    bin=.gpu/workload-kernel-bench; [ $b = prev ] && bin=.gpu/prev34/workload-kernel-bench
    echo "== $b ($bin) rep $rep" >> $OUT/bench-attention.log
    timeout 100 $bin --bench 'gpu/attention bf16 .attention_wgmma_bf16' >> $OUT/bench-attention.log 2>&1; echo "exit $?" >> $OUT/bench-attention.log
  done
done
grep -E '^==|^gpu/|time:|thrpt:|^exit' $OUT/bench-attention.log
for rep in 1 2 3; do
  for b in prev new; do
    bin=.gpu/gpushare-workload; [ $b = prev ] && bin=.gpu/prev35/gpushare-workload
    echo "== $b ($bin) rep $rep" >> $OUT/bench-workload.log
    timeout 90 $bin bench --models yolos-small --precisions bf16 --iters 300 --split >> $OUT/bench-workload.log 2>&1; echo "exit $?" >> $OUT/bench-workload.log
  done
done
grep -E "^==|yolos|gemm  |attention  |layernorm  |sum of|^exit" $OUT/bench-workload.log
timeout 300 make bench-peer BUNDLE=$OUT/peer WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer.log 2>&1; echo "exit $?" >> $OUT/bench-peer.log
tail -12 $OUT/bench-peer.log
