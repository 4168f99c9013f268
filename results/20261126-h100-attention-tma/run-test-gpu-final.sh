#!/bin/bash
# `make test-gpu` at the stop's last kernel commit (d25c046): every GPU test, MiniLM's included.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-test-final.csv
cat $OUT/gpu-test-final.csv
( time timeout 400 env GPUSHARE_MINILM_DIR=.gpu/minilm-bf16 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture ) > $OUT/test-gpu-final.log 2>&1; echo "exit $?" >> $OUT/test-gpu-final.log
grep -E "test result|FAILED|panicked|^exit|real|attention (Bf16|Tf32) .*d64|minilm-l6 .*graph=true" $OUT/test-gpu-final.log
