"""The SmolVLA runtime: checkpoint loading, preprocessing, the Engine (prefill, decode, real-time-chunking
guidance), CPU and CUDA graphs, and ``edgefm-vla tune``. Kernels through dispatch/. No ROS."""
