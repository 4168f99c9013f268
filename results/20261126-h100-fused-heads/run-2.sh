#!/bin/bash
# MiniLM's GPU test with this folder's bundle (programmatic launch and the fused heads;
# MiniLM has no detection heads, so this checks the launch change). Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-minilm.csv
cat $OUT/gpu-minilm.csv
( time timeout 300 env GPUSHARE_MINILM_DIR=.gpu/minilm-bf16 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture minilm ) > $OUT/test-gpu-minilm.log 2>&1; echo "exit $?" >> $OUT/test-gpu-minilm.log
grep -E "test result|FAILED|panicked|^exit|real|err" $OUT/test-gpu-minilm.log | head -20
