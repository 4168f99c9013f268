#!/bin/bash
# `make bench-peer` again, with PyTorch also run one process per precision (as ours has
# been since 984ec2c; the review of this stop noted the asymmetry), the fused-heads bundle.
# Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-3.csv
cat $OUT/gpu-3.csv
timeout 500 make bench-peer BUNDLE=$OUT/peer-2 WORKLOAD_BIN=.gpu/gpushare-workload > $OUT/bench-peer-2.log 2>&1; echo "exit $?" >> $OUT/bench-peer-2.log
tail -6 $OUT/bench-peer-2.log
