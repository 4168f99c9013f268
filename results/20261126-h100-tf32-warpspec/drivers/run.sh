#!/bin/bash
# Builds and runs the standalone attention driver (nvcc, sm_90a; links libcuda for the tensor map).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=${TMPDIR:-/tmp}/attention-tf32-driver
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B attention.cu -lcuda > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(attention_base_tf32|ws)" $B.build.log | grep -E "entry|spill|Used"
timeout 300 $B
