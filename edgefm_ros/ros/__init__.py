"""ROS helpers: msg <-> numpy conversion (convert, images, joints), QoS profiles (qos), parameter
declaration (params, vla_params, action_params), diagnostics, and the VLA node's sensor cache and
observation assembly (observation), and the VLA node's shadow mode (shadow). images, joints, params,
observation, shadow and the *_params specs work without ROS; convert, qos and diagnostics import the ROS
message packages.
"""
