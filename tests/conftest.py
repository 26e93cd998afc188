"""Fixtures shared by the whole suite: repository paths and an isolated ROS 2 domain per test; strict mode.

Strict mode (EDGEFM_STRICT_TESTS=1, set by .ci/run): a skip whose reason is not of a kind in
``skips.ALLOWED`` (no GPU, CPU instruction set, opt-in) fails, at collection or at run time.
"""
import itertools
import os
import sys
import threading
from pathlib import Path

import pytest

# Triton's LLVM first: once the simulator has loaded Mesa's EGL libraries into a process, the import of triton
# that torch's optimizers trigger segfaults (both bring an LLVM); loaded in this order, both work. The suite
# runs simulator, training and kernel tests in one process. Without a GPU, Triton's kernels run only under its
# interpreter, which must be chosen before triton is imported (tests/kernels/test_kernel_triton.py).
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch._dynamo  # noqa: E402,F401

sys.path.insert(0, str(Path(__file__).resolve().parent))  # skips.py (test files are imported by path)
# the strict-mode hooks (tests/skips.py), registered here by name
from skips import pytest_make_collect_report, pytest_runtest_makereport, pytest_terminal_summary  # noqa: E402,F401
from skips import require_material  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def install_root(repo_root) -> Path:
    """colcon's install space of this package (made by scripts/setup.sh)."""
    return repo_root / "install" / "edgefm_ros"


@pytest.fixture(scope="session")
def shared_reference(repo_root) -> Path:
    """../shared/reference beside the clone (reference checkpoints and goldens); skips when absent."""
    path = repo_root.parent / "shared" / "reference"
    require_material(path.is_dir(), f"shared reference material not found at {path}")
    return path


_TESTS = itertools.count()


def _domain_id() -> int:
    """A ROS_DOMAIN_ID in [10, 101] (ROS 2's safe range on Linux) for the next test: new for every test, so no
    participant an earlier test left behind shares it (a live participant in the domain writes to departed
    nodes' shared-memory ports and re-creates their files after the nodes removed them); distinct per xdist
    worker (each takes every n-th id); varied between concurrent runs."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = int(run[:8], 16) if run else os.getpid()
    span = 92 - 92 % workers  # a multiple of the worker count: workers never meet
    return 10 + (base * workers + index + workers * next(_TESTS)) % span


@pytest.fixture
def spin_in_background():
    """``start(executor, context, stop=None)``: spin ``executor`` in a daemon thread until ``context`` shuts
    down (or ``stop`` is set); returns the started thread. The pattern every ROS test needs."""
    def start(executor, context, stop: threading.Event | None = None) -> threading.Thread:
        from edgefm_ros.ros.spin import spin_until_shutdown

        thread = threading.Thread(target=spin_until_shutdown, args=(executor, context, stop), daemon=True)
        thread.start()
        return thread
    return start


@pytest.fixture
def ros_domain_id(monkeypatch) -> int:
    """Put this test's ROS 2 traffic (its own and its subprocesses') in a domain of its own, on localhost."""
    domain = _domain_id()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return domain
