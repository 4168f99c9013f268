export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
python3 make_var.py > var.cuh && nvcc -Xptxas -v -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -o var var.cu > build2.log 2>&1 || { grep -E 'error' build2.log | head; exit 1; }
grep -A3 -E "Compiling entry function .(var_|attention_wgmma_bf16)" build2.log | grep -E "entry|spill|Used"
./var
#cuobjdump -sass var | awk '/Function : attention_wgmma_bf16_d64$/,/Function : [^a]/' | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -30
false && ncu --kernel-name attention_wgmma_bf16_d64 --launch-skip 2 --launch-count 1 --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section SchedulerStats --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__sass_inst_executed_op_shared_ld.sum ./var prof 2>&1 | grep -vE '^==PROF==|^\s*$' | tail -90
