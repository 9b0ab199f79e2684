"""GPU utilisation sampling (ks_inductor.gpu_util) on a CPU: the nvidia-smi source through a fake ``nvidia-smi`` on
PATH (a real process per sample, its csv parsed and averaged), nothing at all where no source exists, NVML where
``pynvml`` is installed and finds a GPU, and the averages reaching ``warm``'s summary."""

from __future__ import annotations

import json
import os
import stat
import textwrap
import types
from pathlib import Path

import pytest

from ks_inductor import gpu_util as G

PROBLEMS = Path(__file__).resolve().parent / "problems"


def _fake_smi(folder: Path, rows: list[list[tuple[int, float]]]) -> Path:
    """An ``nvidia-smi`` that answers the utilisation query with ``rows[k]`` on its k-th call (the last one after
    that), counting its calls in a file beside it, and refuses any other query."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env python3
        import json, sys
        from pathlib import Path
        if sys.argv[1:] != {G.SMI_QUERY!r}:
            sys.exit(9)
        rows = json.loads({json.dumps(json.dumps(rows))})
        count = Path({str(folder / "calls")!r})
        n = int(count.read_text()) if count.exists() else 0
        count.write_text(str(n + 1))
        print("\\n".join(f"{{i}}, {{v:g}}" for i, v in rows[min(n, len(rows) - 1)]))
    """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setattr(G, "_nvml_reader", lambda: None)


def test_parse_smi_csv_keeps_what_it_can_read():
    text = "0, 37\n1, 100\n2, [N/A]\nWARNING: infoROM is corrupted at gpu 0000:03:00.0\n\n3,0\n"
    assert G.parse_smi_csv(text) == {0: 37.0, 1: 100.0, 3: 0.0}


def test_visible_indices():
    assert G.visible_indices({}) is None
    assert G.visible_indices({"CUDA_VISIBLE_DEVICES": "0"}) == {0}
    assert G.visible_indices({"CUDA_VISIBLE_DEVICES": "2,3"}) == {2, 3}
    assert G.visible_indices({"CUDA_VISIBLE_DEVICES": "GPU-8a1b"}) is None  # UUIDs: show every GPU
    assert G.visible_indices({"CUDA_VISIBLE_DEVICES": ""}) == set()


def test_nvidia_smi_samples_are_averaged_per_gpu(tmp_path, monkeypatch, no_nvml):
    rows = [[(0, 10), (1, 0)], [(0, 30), (1, 50)], [(0, 80), (1, 100)]]
    folder = _fake_smi(tmp_path / "bin", rows)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = G.GpuSampler(interval_s=0.05)
    assert gpu.available and gpu.source == "nvidia-smi"
    # Finding the source asked once (rows[0]); that probe is not a sample of the run.
    assert gpu.means() == {} and gpu.text() == ""
    assert gpu.sample() == {0: 30.0, 1: 50.0}
    assert gpu.sample() == {0: 80.0, 1: 100.0}
    assert gpu.means() == {0: 55.0, 1: 75.0}
    assert gpu.summary() == [{"gpu": 0, "mean": 55.0, "max": 80.0, "samples": 2},
                             {"gpu": 1, "mean": 75.0, "max": 100.0, "samples": 2}]
    assert gpu.text() == "GPU 0 55% 1 75%" and gpu.text(latest=True) == "GPU 0 80% 1 100%"
    assert G.mean_of(gpu.summary()) == 65.0 and G.mean_of(gpu.summary(), [1]) == 75.0
    assert G.mean_of([]) is None


def test_the_background_thread_samples_until_stopped(tmp_path, monkeypatch, no_nvml):
    folder = _fake_smi(tmp_path / "bin", [[(0, 40), (1, 60), (2, 90)]])
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    import time

    with G.GpuSampler(interval_s=0.05) as gpu:
        deadline = time.monotonic() + 30
        while sum(g["samples"] for g in gpu.summary()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    calls = int((folder / "calls").read_text())
    time.sleep(0.3)
    assert int((folder / "calls").read_text()) == calls  # stopped means no more processes
    summary = gpu.summary()
    assert [g["gpu"] for g in summary] == [0, 2]  # GPU 1 is not this run's
    assert all(g["samples"] >= 3 for g in summary)
    assert [(g["mean"], g["max"]) for g in summary] == [(40.0, 40.0), (90.0, 90.0)]


def test_no_source_means_nothing_sampled_and_nothing_shown(tmp_path, monkeypatch, no_nvml):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    gpu = G.GpuSampler(interval_s=0.01)
    assert not gpu.available and gpu.source is None
    with gpu:
        assert gpu._thread is None
    assert gpu.sample() == {} and gpu.summary() == [] and gpu.text() == ""


def test_an_nvidia_smi_that_fails_is_no_source(tmp_path, monkeypatch, no_nvml):
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\n"
                      "exit 9\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    assert G.find_reader() == (None, None)


def test_nvml_when_installed():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # noqa: BLE001 - the driver's own error types
        pytest.skip(f"NVML finds no driver: {e}")
    if count == 0:
        pytest.skip("NVML sees no GPU")
    gpu = G.GpuSampler(source="nvml", gpus=range(count))
    assert gpu.source == "nvml"
    got = gpu.sample()
    assert set(got) == set(range(count)) and all(0.0 <= v <= 100.0 for v in got.values())
    assert [g["samples"] for g in gpu.summary()] == [1] * count


def test_warm_reports_the_average_utilisation_of_its_run(tmp_path, monkeypatch, no_nvml):
    """warm() samples while its searches run, on a host whose judge times kernels, and puts the averages in its
    summary (JSON and table); the searches here are stand-ins that take a moment each."""
    import time

    from rich.console import Console

    import ks_inductor.evolve as E
    from kernel_cache.testing import h200
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.warm import warm

    folder = _fake_smi(tmp_path / "bin", [[(0, 20), (1, 60)]])
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(G, "DEFAULT_INTERVAL_S", 0.05)

    class _Result:
        judged, accepted = 3, 0
        why = note = ""

        def to_json(self):
            return {"judged": self.judged, "accepted": self.accepted}

    class _Store:
        def lookup(self, key, fp):
            return None

    class _Judge:
        fingerprint = h200()
        device_count = 2
        backend = types.SimpleNamespace(device="cuda")

    def fake_evolve(problem, config, store, judge=None, progress=True):
        time.sleep(0.4)
        return _Result()

    monkeypatch.setattr(E, "evolve_problem", fake_evolve)
    problems = [load_problem(PROBLEMS / "rmsnorm.py"), load_problem(PROBLEMS / "tiny_output.py")]
    console = Console(file=open(os.devnull, "w"), width=200)
    for parallel in (1, 2):  # one region after another, and the threads' live view
        summary = warm(problems, _Store(), EvolveConfig(parallel_regions=parallel, inductor_seeds=False), judge=_Judge(), console=console)
        js = summary.to_json()
        assert js["gpu_util_source"] == "nvidia-smi" and js["judged"] == 6
        assert [(g["gpu"], g["mean"]) for g in js["gpu_util"]] == [(0, 20.0), (1, 60.0)]
        assert all(g["samples"] >= 1 for g in js["gpu_util"])
        assert summary.gpu_text() == "average GPU utilisation: GPU 0 20%, GPU 1 60%"
    json.dumps(js)
