"""Thin ROS 2 shells (vla_node, action_node, router_node), started as executables; nothing imports them."""
