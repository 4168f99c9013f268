#!/bin/bash
# The split timed two ways, alternated on one card: enqueued launch by launch (.gpu/eager-split:
# the bundle made at 3736190) and as one graph per step (.gpu: the bundle made at 657cd69).
# Five quiet rounds, then two rounds with every CPU core kept busy by a shell loop (bounded
# by timeout), to see whether a busy host inflates either. nvidia-smi samples the clocks.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv > $OUT/gpu-2.csv
cat $OUT/gpu-2.csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks_throttle_reasons.active,power.draw --format=csv -lms 100 > $OUT/clocks-2.csv &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
one() {  # $1 label, $2 binary
  echo "== $1 start $(date +%H:%M:%S.%N)" >> $OUT/bench-2.log
  timeout 90 $2 bench --models yolos-small --precisions bf16,tf32 --iters 300 --split >> $OUT/bench-2.log 2>&1; echo "exit $? end $(date +%H:%M:%S.%N)" >> $OUT/bench-2.log
}
for rep in 1 2 3 4 5; do
  one "eager rep $rep" .gpu/eager-split/gpushare-workload
  one "graph rep $rep" .gpu/gpushare-workload
done
for rep in 1 2; do
  for i in $(seq $(nproc)); do timeout 30 sh -c 'while :; do :; done' & done
  sleep 1
  one "eager busy-host rep $rep" .gpu/eager-split/gpushare-workload
  one "graph busy-host rep $rep" .gpu/gpushare-workload
  wait $(jobs -p | grep -v "^$SMI$") 2>/dev/null
done
kill $SMI; wait $SMI 2>/dev/null
grep -E "^==|yolos|^    (gemm|attention|layernorm|sum)   |gemm (qkv|proj|fc1|fc2)  " $OUT/bench-2.log
awk -F', ' 'NR>1 {print $2, $3}' $OUT/clocks-2.csv | sort | uniq -c | sort -rn | head
