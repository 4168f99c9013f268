# Writes gen/attention.cu and gen/streamk.cuh: workload/src/cuda/kernels/attention.cu and
# streamk.cuh with global-timer stamps added to the kept bf16 wgmma kernel and the stream-K
# one (block start, end of its key tiles, block end), written by the first consumer thread
# to g_times[4 · block + 0..2] when g_times is set.
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, '../../../workload/src/cuda/kernels/attention.cu')).read()
stamp = lambda v: f'unsigned long long {v}; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"({v}));'
def patch(s, entry, mid_anchor, end_anchor):
    i = s.index(entry)
    j = s.index('const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;', i)
    s = s[:j] + stamp('t_a') + '\n    ' + s[j:]
    k = s.index(mid_anchor, j)
    s = s[:k] + stamp('t_b') + '\n    ' + s[k:]
    e = s.index(end_anchor, k) + len(end_anchor)
    ins = ('\n    { ' + stamp('t_c') + ' if (g_times && threadIdx.x == 128) { const int q = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);'
           ' g_times[4 * q] = t_a; g_times[4 * q + 1] = t_b; g_times[4 * q + 2] = t_c; } }')
    return s[:e] + ins + s[e:]
src = patch(src, 'attention_wgmma_bf16_d64(const', 'finish_rows_staged(o, l0, l1, sm + c * QTILE',
            'finish_rows_staged(o, l0, l1, sm + c * QTILE, 1 + c, out, b, h, q0 + 64 * c, seq, heads, tid & 127);')
sk = patch(open(os.path.join(here, 'streamk.cuh')).read(), 'attention_wgmma_bf16_d64_sk(const', '    if (owner) {',
           'sQ(0, c), 1 + c, out, b, h, qg * BQ + 64 * c, seq, heads, tid & 127);\n        }\n    }')
os.makedirs(os.path.join(here, 'gen'), exist_ok=True)
open(os.path.join(here, 'gen/attention.cu'), 'w').write(src)
open(os.path.join(here, 'gen/streamk.cuh'), 'w').write(sk)
