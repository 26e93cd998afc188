"""edgefm_ros: Vision-Language-Action inference for ROS 2 robots (SmolVLA on our own runtime).

The package spans two install trees under colcon (this source tree and the install space that holds
the generated ``edgefm_ros.msg``), so its ``__path__`` is extended to find both.
"""
from pkgutil import extend_path


__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
