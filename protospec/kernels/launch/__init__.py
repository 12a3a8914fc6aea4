"""How a kernel reaches the device: interop.py (the only torch <-> Numba bridge: CUDA array
interface, torch's stream, simulator views, bound launches), the CUDA simulator's choice, launches
through the driver, and programmatic dependent launch (sm_90)."""
