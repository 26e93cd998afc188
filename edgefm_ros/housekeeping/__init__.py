"""What a run leaves on the machine and how it is removed: Fast DDS shared-memory files no live process
uses, and the processes a tool started. Imports no ROS: launch files, tools and tests call it."""
