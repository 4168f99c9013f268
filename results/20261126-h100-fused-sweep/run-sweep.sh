#!/bin/bash
# The default sweep with this stop's bundle (programmatic launch and the fused heads, at the
# commit of results/20261126-h100-fused-heads), its report, and compare with stop 36's final sweep.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
ID=20261126-h100-fused-sweep
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
( echo "\$ gpushare-bench sweep --workload-bin .gpu/gpushare-workload --run-id $ID"; start=$(date +%s)
  timeout 560 .gpu/gpushare-bench sweep --workload-bin .gpu/gpushare-workload --run-id $ID --out $OUT/r; rc=$?
  echo "sweep exit $rc in $(( $(date +%s) - start )) s" ) > $OUT/sweep.log 2>&1
tail -3 $OUT/sweep.log
.gpu/gpushare-bench report $OUT/r/$ID --out $OUT/reports > $OUT/report.log 2>&1; echo "exit $?" >> $OUT/report.log
.gpu/gpushare-bench compare results/20261126-h100-final-sweep $OUT/r/$ID > $OUT/compare-with-20261126-h100-final-sweep.txt 2>&1
cat $OUT/compare-with-20261126-h100-final-sweep.txt | head -40
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > $OUT/after.csv; cat $OUT/after.csv
# The device tool returns at most 8 files, two folders deep: the run and its report travel as one archive.
tar -C $OUT -czf $OUT/sweep.tgz r reports && rm -rf $OUT/r $OUT/reports
ls -la $OUT
