"""Where a request runs (no ROS): the routing/ package decides, this package carries the decision out.

vla.py            an action-chunk request on the edge engine or the cloud, the fallback to the edge, RTC's prefix
vla_requests.py   vla_node's requests: sensor snapshot -> Observation, the route in force, the stamped chunk; counts
vla_build.py      vla_node's engine, cloud client, shadow mode and Placement made from its parameters
engine_thread.py  the one thread the edge engine is built, warmed up and run on
runs.py           one placement's run (what vla.py returns and shadow mode logs)
shadow.py         shadow mode: which requests also run on the other placement, their shared noise, the scored pair
shadow_log.py     the JSONL log of shadowed pairs that ``edgefm-router calibrate --log`` reads
vqa.py            a scene question answered on the edge or in the cloud (streamed), with the fallback to the edge
"""
