#!/bin/bash
# Does the new attention make a lone MPS client slower than an exclusive pod? The same
# two cells (exclusive × 1, MPS × 1, two passes each) with the old workload (.gpu/prev,
# stop 33's) and the new one (`make gpu-bundle` at d25c046), on one card, alternated.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
for b in old new old new; do
  bin=.gpu/gpushare-workload; [ $b = old ] && bin=.gpu/prev/gpushare-workload
  n=$(ls -d $OUT/r/$b-* 2>/dev/null | wc -l); id=$b-$((n + 1))
  echo "== $id ($bin)" >> $OUT/sweeps.log
  timeout 200 .gpu/gpushare-bench sweep --workload-bin $bin --strategies exclusive,mps --pods 1 --repeat 2 --run-id $id --out $OUT/r >> $OUT/sweeps.log 2>&1; echo "exit $?" >> $OUT/sweeps.log
done
grep -E "^==|done:|exit" $OUT/sweeps.log
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > $OUT/after.csv; cat $OUT/after.csv
tar -C $OUT -czf $OUT/runs.tgz r && rm -rf $OUT/r
