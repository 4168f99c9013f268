#!/bin/bash
# Builds and runs the bound-finding driver (nvcc, sm_90a), samples the clocks while the
# kept kernel runs back to back, then reads its counters with Nsight Compute. Reads only:
# ncu runs with --clock-control none, so no clock is locked or changed.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm,power.limit --format=csv | tee $O/gpu.csv
B=${TMPDIR:-/tmp}/bound-driver
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B driver.cu -lcuda > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(att_|attention_wgmma_bf16)" $B.build.log | grep -E "entry|spill|Used"
timeout 120 $B time
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks_throttle_reasons.active,power.draw,temperature.gpu --format=csv -lms 100 > $O/clocks.csv &
SMI=$!
sleep 0.5
timeout 30 $B loop 3
sleep 0.3
kill $SMI; wait $SMI 2>/dev/null
awk -F', ' 'NR>1 {print $2, $3}' $O/clocks.csv | sort | uniq -c | sort -rn | head -6
awk -F', ' 'NR>1 {gsub(/ W/,"",$4); if ($4+0 > mx) mx = $4+0} END {print "max power", mx, "W"}' $O/clocks.csv
timeout 240 ncu --clock-control none --kernel-name attention_wgmma_bf16_d64 --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex.sum,lts__t_bytes.sum.per_second,sm__cycles_active.avg,smsp__average_warp_latency_issue_stalled_barrier,l1tex__m_xbar2l1tex_read_bytes.sum.per_second \
  $B ncu > $O/ncu.txt 2>&1; echo "ncu exit $?"
grep -v "^==PROF==" $O/ncu.txt | sed -n 1,200p
