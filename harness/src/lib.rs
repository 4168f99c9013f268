//! gpushare-bench: the harness that switches a GPU between sharing strategies, scales
//! the workload, and reports what sharing costs.
