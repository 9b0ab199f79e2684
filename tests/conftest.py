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

# No test writes the user's kernelsmith home (~/.cache/kernelsmith: the default cache, graph analyses, kernel
# modules): each test process gets a home of its own, removed when its session ends. A test that needs another
# home sets KERNELSMITH_HOME itself.
_HOME = tempfile.mkdtemp(prefix="kernelsmith-test-home-")
_HOME_OWNER = os.getpid()
os.environ["KERNELSMITH_HOME"] = _HOME


def pytest_unconfigure(config):
    if os.getpid() == _HOME_OWNER:  # never from a process forked off a test
        shutil.rmtree(_HOME, ignore_errors=True)


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
