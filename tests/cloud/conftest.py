"""Fixtures for the cloud tier tests: the tiny reference checkpoint, the local engine on it, an RNG
that is fresh every run. Helpers (the server process) are in cloud_support.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# test files are imported by path (--import-mode=importlib): put this folder on sys.path for cloud_support
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_dirs(shared_reference):
    return shared_reference / "smolvla-tiny", shared_reference / "vlm" / "smolvlm-tiny"


@pytest.fixture(scope="session")
def local_engine(tiny_dirs):
    from edgefm_ros.runtime.engine import Engine

    engine = Engine.from_checkpoint(tiny_dirs[0], vlm_dir=tiny_dirs[1], mode="exact")
    engine.warmup()
    return engine


@pytest.fixture
def rng():
    return np.random.default_rng()  # fresh inputs every run
