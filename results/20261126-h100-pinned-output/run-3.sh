#!/bin/bash
# bench-peer with this folder's workload binary. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-3.csv
cat $OUT/gpu-3.csv
timeout 300 make bench-peer BUNDLE=$OUT/peer WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer.log 2>&1; echo "exit $?" >> $OUT/bench-peer.log
tail -6 $OUT/bench-peer.log
