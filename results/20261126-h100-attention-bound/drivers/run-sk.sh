#!/bin/bash
# Builds and runs the stream-K driver (sk.cu, on gen/attention.cu made by timed.py), then
# reads both kernels' counters with Nsight Compute (--clock-control none). Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm,power.limit --format=csv | tee $O/gpu-sk.csv
python3 timed.py || exit 1
B=${TMPDIR:-/tmp}/sk-driver
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B sk.cu -lcuda > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(att_copy|attention_wgmma_bf16)" $B.build.log | grep -E "entry|spill|Used"
timeout 300 $B; echo "exit $?"
false && timeout 200 ncu --clock-control none --kernel-name regex:attention_wgmma_bf16_d64 --launch-skip 4 --launch-count 2 \
  --metrics sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,gpc__cycles_elapsed.max,smsp__inst_executed.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg,lts__t_bytes.sum.per_second,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
  $B ncu > $O/ncu-sk.txt 2>&1; echo "ncu exit $?"
grep -v "^==PROF==" $O/ncu-sk.txt | grep -v " 0$\| 0,00$" | awk '$NF != "0" && $NF != "0.00"' | sed -n 1,120p
