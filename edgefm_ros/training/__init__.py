"""Training SmolVLA on demonstrations (no ROS): LeRobot's flow-matching objective over the runtime's
own modules, writing LeRobot-layout checkpoints the Engine loads as they are."""
