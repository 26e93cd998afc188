"""Command-line tools: the VLA runtime CLI, rosbag tools, the demo, benchmarks."""
