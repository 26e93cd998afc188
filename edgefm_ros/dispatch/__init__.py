"""Kernel dispatch and search, below every engine: the engine modes (modes), the hardware profile (hardware),
the operator implementation table and its resolution (table, with the built-in tables in tables/), the
tables an engine loads for a mode and machine (resolver), skill manifests (skills), per-op timing (profile)
and the model-independent kernel search (search). Imports edgefm_kernels; no engine, no model, no ROS."""
