"""The simulated robot (no ROS): Meta-World v3 tasks behind an absolute end-effector position interface
(env), the scripted expert and its demonstrations in LeRobot's dataset layout (expert, collect, dataset),
the synchronous closed loop (rollout), the wall-clock episode logic of sim_node (live; its loop's schedule:
pacing; what it reports: live_report) and the shared
evaluation report (report). What an episode's seed decides besides the layout, its camera condition
(conditions: blur, exposure, sensor noise, JPEG on the wire; sets clean/degraded/mixed) and its instruction's
wording (tasks), is drawn in one place (episode) for every executor."""
