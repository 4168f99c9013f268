#!/bin/bash
# The bf16 wgmma attention built by nvcc and by NVRTC (the workload's options and variants),
# timed in one harness; then each build's SASS instruction count. Reads only.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode,clocks.max.sm --format=csv | tee $OUT/gpu.csv
B=${TMPDIR:-/tmp}/nvrtc-cmp
nvcc -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o $B cmp.cu -lcuda -lnvrtc > $B.build.log 2>&1 || { grep -E 'error' $B.build.log | head; exit 1; }
timeout 120 $B; echo "exit $?"
cuobjdump -sass -fun attention_wgmma_bf16_d64 $B > $OUT/sass-nvcc.txt 2>&1
for c in $OUT/nvrtc-*.cubin; do cuobjdump -sass -fun attention_wgmma_bf16_d64 $c > ${c%.cubin}.sass.txt 2>&1; done
for s in $OUT/sass-nvcc.txt $OUT/nvrtc-*.sass.txt; do echo "$(basename $s): $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $s) instructions, $(grep -cE 'WARPGROUP.ARRIVE|WARPGROUP.DEPBAR' $s) warpgroup arrive/depbar"; done
rm -f $OUT/nvrtc-*.cubin
