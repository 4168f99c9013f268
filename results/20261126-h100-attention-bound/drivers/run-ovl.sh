#!/bin/bash
# Builds and runs the overlap driver (ovl.cu). Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm,power.limit --format=csv | tee $O/gpu-ovl.csv
B=${TMPDIR:-/tmp}/ovl-driver
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B ovl.cu -lcuda > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(att_copy|att_ovl6|att_rs|attention_wgmma_bf16)" $B.build.log | grep -E "entry|spill|Used"
grep -c C7519 $B.build.log
timeout 300 $B; echo "exit $?"
