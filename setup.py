"""pip install of edgefm_ros without ROS: the library, the kernels (edgefm_kernels) and the CLIs.

The ROS install (messages, node executables, launch and config files) is `colcon build` with
CMakeLists.txt/package.xml; a pip-only install has no `edgefm_ros.msg`.
"""
from setuptools import find_packages, setup

setup(
    name="edgefm_ros",
    version="0.1.0",
    description="SmolVLA on a thin dispatch runtime, an edge/cloud router and ROS 2 nodes for robots",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["edgefm_ros", "edgefm_ros.*"]) + ["edgefm_kernels"],
    package_data={"edgefm_ros": ["**/*.yaml", "**/*.json"], "edgefm_kernels": ["*.yaml", "skills/*.yaml", "csrc/*.c", "csrc/*.h"]},
    install_requires=[
        "numpy>=1.26",
        "torch>=2.4",
        "safetensors>=0.4",
        "tokenizers>=0.20",
        "transformers>=4.50",
        "pyyaml>=6.0",
    ],
    extras_require={
        "tools": ["opencv-python-headless", "rosbags", "rosbags-image", "matplotlib", "psutil", "imageio-ffmpeg"],
        "test": ["pytest", "psutil"],
    },
    entry_points={
        "console_scripts": [
            "edgefm-vla=edgefm_ros.tools.vla_cli:main",
            "edgefm-bag=edgefm_ros.tools.bag_cli:main",
            "edgefm-router=edgefm_ros.tools.router_cli:main",
            "edgefm-cloud=edgefm_ros.cloud.cli:main",
            "edgefm-demo=edgefm_ros.tools.demo:main",
            "edgefm-llm=edgefm_ros.tools.llm_cli:main",
            "edgefm-sim=edgefm_ros.tools.sim_cli:main",
            "edgefm-shm-clean=edgefm_ros.housekeeping.shm:main",
        ],
    },
)
