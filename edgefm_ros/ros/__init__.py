"""The ROS side of the nodes: the lifecycle base every node shares (lifecycle), parameter declarations made
rclpy parameters (params; the declarations themselves are edgefm_ros/params), msg <-> numpy conversion
(convert, commands), QoS profiles (qos), diagnostics, running a node as a process (spin), subscriptions
taken on demand (on_demand), the launch arguments (launch_args), and the cloud calls' link samples published
for router_node (link_samples). What works without ROS lives beside it: edgefm_ros/sensors (images, joints,
the sensor cache), edgefm_ros/threads (the model worker, SCHED_FIFO) and edgefm_ros/placement (where a
request runs: edge, cloud, fallback, shadow mode).
"""
