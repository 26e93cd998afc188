"""edgefm_ros: Vision-Language-Action inference for ROS 2 robots (SmolVLA on our own runtime).

The package spans two install trees under colcon (this source tree and the install space that holds
the generated ``edgefm_ros.msg``), so its ``__path__`` is extended to find both.
"""
import os
from pkgutil import extend_path

# OpenMP threads that spin at barriers starve everything else on a small robot CPU (the control loop,
# DDS, the other phase's threads): measured 2-thread decode 0.9 s -> 4-17 s under load. Sleep instead.
# Set before torch loads OpenMP; an explicit setting of the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
