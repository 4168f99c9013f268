#!/bin/bash
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
timeout 150 bash .gpu/dbg3/run.sh > $OUT/streamk.log 2>&1; echo "exit $?" >> $OUT/streamk.log
grep -E "TIME|counters|DIFFERS|max \|" $OUT/streamk.log | head -50
timeout 90 bash .gpu/dbg3/run2.sh > $OUT/softmax-variants.log 2>&1; echo "exit $?" >> $OUT/softmax-variants.log
grep -E "ACC|TIME|Used|spill" $OUT/softmax-variants.log
