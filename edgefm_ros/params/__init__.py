"""Every node's parameters, each declared once (no ROS: parameter files are checked without it).

spec.py is the mechanism (``NodeConfig`` + ``param``: one field per parameter, from which the ``ParamSpec``
list and the typed, frozen config are made); topics.py names the graph's topics and the rule for which are
relative; one module per node holds its declaration: action.py (ActionNodeConfig), vla.py (VlaNodeConfig),
router.py (RouterNodeConfig), sim.py (SimNodeConfig), scene_query.py (SceneQueryConfig).
edgefm_ros/ros/params.py declares them on an rclpy node. Nothing is imported here: a node loads only its
own declaration (vla.py's brings torch, through the RTC settings).
"""
