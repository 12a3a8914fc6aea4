"""Build and inspection tools for the kernels, not used at run time: a type check of every kernel
signature for sm_90 without a GPU (gpu_typecheck), the loads before a dependent's wait
(gpu_wait_order) and ptxas's register report (gpu_registers)."""
