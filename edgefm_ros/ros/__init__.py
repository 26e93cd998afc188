"""The ROS side of the nodes: the lifecycle base every node shares (lifecycle), parameter declarations made
rclpy parameters (params; the declarations themselves are edgefm_ros/params), msg <-> numpy conversion
(convert, commands, images, joints), QoS profiles (qos), diagnostics, running a node as a process (spin),
SCHED_FIFO (realtime), subscriptions taken on demand (on_demand), the launch arguments (launch_args), and
vla_node's sensor cache, worker and shadow mode (observation, worker, shadow). images, joints, realtime,
observation, worker and shadow work without ROS.
"""
