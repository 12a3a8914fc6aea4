"""Tools for whoever changes the kernels, beside the package and not used at run time: a type check of
every kernel signature for sm_90 without a GPU (gpu_typecheck), the loads before a dependent's wait
(gpu_wait_order), ptxas's register report (gpu_registers), and GPU micro-benchmarks that set the kernels'
thresholds (attention_cost, gemv_cost, launch_cost). Run from the checkout: python -m tools.<name>."""
