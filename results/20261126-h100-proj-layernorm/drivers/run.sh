#!/bin/bash
# Builds and runs the standalone driver (nvcc, sm_90a; libcuda for the tensor maps, cuBLASLt).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,uuid,clocks.max.sm --format=csv,noheader
B=${TMPDIR:-/tmp}/proj-ln-driver
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B driver.cu -lcuda -lcublasLt > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .proj_ln" $B.build.log | grep -E "entry|spill|Used"
timeout 300 $B
