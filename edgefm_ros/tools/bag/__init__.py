"""Rosbag tools (rosbags, no ros2 bag needed): synthetic bags (make), replay into live topics (play),
recording (record), reading a recorded run back (analyze), and replay sessions of the node graph (session)."""
