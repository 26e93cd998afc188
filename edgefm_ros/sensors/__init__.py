"""The robot's sensor data without ROS: camera images to and from numpy (camera: raw fields, JPEG/PNG, with
size checks), joint names onto the model's state order (joints), and vla_node's sensor cache that assembles
an ``Observation`` or refuses it with a reason (observation). The ROS message side is edgefm_ros/ros."""
