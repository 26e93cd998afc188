"""The EdgeFM-style runtime: hardware profile, dispatch table, checkpoint loading, the Engine. No ROS."""
