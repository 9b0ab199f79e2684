import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Each xdist worker gets one intra-op thread (and so do the judge workers it spawns): with two workers on two
# cores, OpenMP regions of two threads each wait on a core the other worker holds, and Inductor's compiled CPU
# graphs then measured 12-16 ms per call instead of 0.007, which turned the graph guard's timing tests upside down.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Everything a test run writes outside its checkout lands in one folder, removed when the run ends: temporary
# files and folders (TMPDIR: pytest's tmp_path, the judge's scratch, Inductor's cache), Triton's cache, Ray's
# sessions and each test process's kernelsmith home (the default cache, graph analyses, kernel modules), so that
# neither /tmp nor the user's ~/.triton and ~/.cache/kernelsmith keep anything. xdist's workers inherit the folder
# from the process that made it (through the environment), and only that process removes it. A test that needs
# another home sets KERNELSMITH_HOME itself.
_RUN_DIR = os.environ.get("KERNELSMITH_TEST_RUN_DIR")
_RUN_OWNER = None
if _RUN_DIR is None:
    _RUN_DIR = tempfile.mkdtemp(prefix="ks-test-")  # short: Ray's socket paths must fit 107 bytes
    _RUN_OWNER = os.getpid()
    os.environ["KERNELSMITH_TEST_RUN_DIR"] = _RUN_DIR
    os.environ["TMPDIR"] = _RUN_DIR
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_RUN_DIR, "triton")
    os.environ["RAY_TMPDIR"] = os.path.join(_RUN_DIR, "ray")
tempfile.tempdir = None  # read TMPDIR again
_HOME = tempfile.mkdtemp(prefix="home-", dir=_RUN_DIR)
os.environ["KERNELSMITH_HOME"] = _HOME


def pytest_unconfigure(config):
    if os.getpid() == _RUN_OWNER:  # never from a worker or a process forked off a test
        shutil.rmtree(_RUN_DIR, ignore_errors=True)


# Candidate kernels in tests run through the Triton interpreter on CPU unless a GPU test asks otherwise.
if not os.environ.get("KS_TEST_GPU"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

PROBLEMS = ROOT / "tests" / "problems"
CANDIDATES = ROOT / "tests" / "candidates"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda() and os.environ.get("TRITON_INTERPRET") != "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA/MACA GPU (run with KS_TEST_GPU=1 on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def judge():
    """The interpreter judge the template tests share, one per test module (a module may define its own)."""
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(backend="triton-interpret", trials=3)) as j:
        yield j


# The throwaway PostgreSQL server for the cache tests that need one (tests/postgres_server.py).
from tests.postgres_server import postgres_cluster, postgres_url  # noqa: E402,F401
