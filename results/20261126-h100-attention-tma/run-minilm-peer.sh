#!/bin/bash
# The MiniLM GPU test (its weights and the test binary exceed, with run.sh's binaries, what
# the device tool carries in one call) and `make bench-peer` with the new binary.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-minilm-peer.csv
cat $OUT/gpu-minilm-peer.csv
( time timeout 300 env GPUSHARE_MINILM_DIR=.gpu/minilm-bf16 .gpu/workload-gpu-tests --ignored --test-threads=1 --nocapture minilm ) > $OUT/test-gpu-minilm.log 2>&1; echo "exit $?" >> $OUT/test-gpu-minilm.log
grep -E "test result|FAILED|panicked|^exit|real" $OUT/test-gpu-minilm.log
timeout 400 make bench-peer BUNDLE=$OUT/peer WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer.log 2>&1; echo "exit $?" >> $OUT/bench-peer.log
tail -25 $OUT/bench-peer.log
timeout 200 bash results/20261126-h100-attention-tma/drivers/run.sh > $OUT/driver-final.log 2>&1; echo "exit $?" >> $OUT/driver-final.log
grep -E "TIME (base|kept|unstaged)|exit" $OUT/driver-final.log
