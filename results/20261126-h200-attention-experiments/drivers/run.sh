export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o sk sk.cu > build.log 2>&1 || { grep -E 'error' build.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(attention_wgmma_bf16|attention_sk)" build.log | grep -E "entry|spill|Used"
./sk
