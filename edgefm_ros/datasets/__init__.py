"""Robot recordings (rosbag2, sqlite3 or MCAP) -> LeRobot v3.0 datasets, and LeRobot datasets -> arrays.

No ROS is imported here (bags are read with ``rosbags``), so it runs wherever the training does.

    from edgefm_ros.datasets.convert import ConvertConfig, convert_bags
    from edgefm_ros.datasets.mapping import DatasetMapping, load_mapping
    report = convert_bags(["rec_bag"], "datasets/rec", load_mapping("map.yaml"), ConvertConfig(fps=20))
    from edgefm_ros.datasets.reader import read_lerobot_dataset
    ds = read_lerobot_dataset("datasets/rec")     # video or image cameras -> uint8 arrays

Modules: bagread (first pass over a bag), sync (reference-clock sampling), episodes (episode cues), mapping
(topics -> features), images (camera messages -> RGB), video (MP4 with PyAV), stats, v3writer (the LeRobot
v3.0 layout), report, convert (the two passes, atomic output), reader, synthbag (synthetic recordings).
"""
