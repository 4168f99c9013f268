#!/bin/bash
# Does the card slow down when a `bench --split` reads high? Six bf16 runs with the split
# (the bundle made at 3736190), while nvidia-smi samples the SM clock, the active throttle
# reasons, power and temperature every 100 ms. Reads only; changes no setting.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm,power.limit --format=csv > $OUT/gpu.csv
cat $OUT/gpu.csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,clocks_throttle_reasons.active,power.draw,temperature.gpu --format=csv -lms 100 > $OUT/clocks.csv &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
sleep 1
for rep in 1 2 3 4 5 6; do
  echo "== rep $rep start $(date +%H:%M:%S.%N)" >> $OUT/bench.log
  timeout 90 .gpu/gpushare-workload bench --models yolos-small --precisions bf16 --iters 300 --split >> $OUT/bench.log 2>&1; echo "exit $? end $(date +%H:%M:%S.%N)" >> $OUT/bench.log
done
sleep 1
kill $SMI; wait $SMI 2>/dev/null
grep -E "^==|yolos|gemm  |gemm (qkv|proj|fc1|fc2)  |attention  |layernorm|^exit" $OUT/bench.log
awk -F', ' 'NR>1 {print $2, $4}' $OUT/clocks.csv | sort | uniq -c | sort -rn | head -12
