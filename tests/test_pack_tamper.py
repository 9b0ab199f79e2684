"""Every way a pack can be bad is refused with a clear reason, and the database stays byte-for-byte as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kernel_cache.errors import PackError
from kernel_cache.pack import FORMAT_VERSION, export_pack
from kernel_cache.record import KernelRecord
from kernel_cache.store import KernelStore
from kernel_cache.testing import a100, forge_kernel_source, rewrite_pack
from ks_inductor.judge.packs import import_pack, verify_pack

ROOT = Path(__file__).resolve().parent.parent
RMSNORM_OK = (ROOT / "tests" / "candidates" / "rmsnorm_ok.py").read_text()


@pytest.fixture(scope="module")
def here():
    from ks_inductor.judge.backends import current_fingerprint

    return current_fingerprint("triton-interpret")


@pytest.fixture(scope="module")
def good_pack(tmp_path_factory, here):
    from ks_inductor.problem_tracing import load_problem

    d = tmp_path_factory.mktemp("good")
    problem = load_problem(ROOT / "tests" / "problems" / "rmsnorm.py")
    with KernelStore(str(d / "src.db")) as s:
        s.upsert_problem(problem)
        s.add_kernel(KernelRecord(problem.key, RMSNORM_OK, here.backend, here.to_json(), timed=False, trials=5))
        export_pack(s, d / "good.kspack")
    return d / "good.kspack"


def _flip_tail(data: bytes) -> bytes:
    return data[:-4] + bytes(b ^ 0x55 for b in data[-4:])


def _with_plan(kernel: str):
    """A kernel's metadata given a judged plan that launches ``kernel``, as a forger would add one."""
    view = {"storage": 0, "offset": 0, "shape": [4], "stride": [1], "dtype": "float32"}
    plan = {"version": 1, "storages": [{"kind": "input", "index": 0, "nbytes": 16}],
            "steps": [{"op": "launch", "kernel": kernel, "grid": [1, 1, 1], "args": {"x_ptr": {"t": view}}}],
            "outputs": [view]}

    def edit(meta: bytes) -> bytes:
        return json.dumps({**json.loads(meta), "plan": json.dumps(plan)}).encode()

    return edit


def _future(m: dict) -> None:
    m["format_version"] = FORMAT_VERSION + 1


CASES = {
    "truncated": (lambda src, dst: dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2]), "truncated"),
    "not a zip": (lambda src, dst: dst.write_bytes(b"PK\x03\x04 garbage" * 50), "not a readable zip"),
    "missing manifest": (lambda src, dst: rewrite_pack(src, dst, {"manifest.json": lambda _: None}), "no manifest"),
    "changed kernel source": (
        lambda src, dst: rewrite_pack(src, dst, {"kernels/00000.py": lambda b: b.replace(b"1.0 /", b"2.0 /")}),
        "kernels/00000.py changed"),
    "changed test vector": (
        lambda src, dst: rewrite_pack(src, dst, {"vectors/00000.safetensors": _flip_tail}),
        "vectors/00000.safetensors changed"),
    "changed metadata": (
        lambda src, dst: rewrite_pack(src, dst, {"kernels/00000.json": lambda b: b.replace(b'"verified"',
                                                                                           b'"verified" ')}),
        "kernels/00000.json changed"),
    "entry added": (lambda src, dst: rewrite_pack(src, dst, {"kernels/extra.py": lambda _: b"import os\n"}),
                    "not listed in the manifest"),
    "entry removed": (lambda src, dst: rewrite_pack(src, dst, {"kernels/00000.json": lambda _: None}),
                      "missing from the pack"),
    "future format": (lambda src, dst: rewrite_pack(src, dst, {}, manifest_edit=_future),
                      f"format version {FORMAT_VERSION + 1} was written by a newer kernelsmith"),
    "judged plan launching what the source lacks, with consistent hashes": (
        lambda src, dst: rewrite_pack(src, dst, {"kernels/00000.json": _with_plan("_elsewhere")}, rehash=True),
        "its judged plan launches _elsewhere, which its source does not define as Triton kernels"),
    "malformed judged plan with consistent hashes": (
        lambda src, dst: rewrite_pack(src, dst, {"kernels/00000.json": lambda b: json.dumps(
            {**json.loads(b), "plan": "{not json"}).encode()}, rehash=True),
        "its judged plan is malformed"),
    "unsafe kernel with consistent hashes": (
        lambda src, dst: forge_kernel_source(src, dst, 0, RMSNORM_OK.replace(
            "import torch\n", "import os\nimport torch\n", 1)),
        "static safety rule"),
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampered_pack_is_refused_and_db_untouched(case, good_pack, here, tmp_path):
    make, expected = CASES[case]
    bad = tmp_path / "bad.kspack"
    make(good_pack, bad)
    report = verify_pack(bad, fingerprint=here)
    assert not report.ok
    assert any(expected in r for r in report.reasons), report.reasons

    db = tmp_path / "kernels.db"
    with KernelStore(str(db)) as s:
        s.add_kernel(KernelRecord("existing", RMSNORM_OK, here.backend, here.to_json(), timed=False))
    before = _digest(db)
    with KernelStore(str(db)) as s:
        with pytest.raises(PackError, match="refused") as err:
            import_pack(bad, s, fingerprint=here)
        assert any(expected in r for r in err.value.reasons)
        assert len(s.kernels()) == 1
    assert _digest(db) == before


def test_fingerprint_that_does_not_fit(good_pack, here):
    on_gpu = a100()
    report = verify_pack(good_pack, fingerprint=on_gpu)
    assert not report.ok and "does not fit this machine" in report.reasons[0]
    assert report.kernels[0].fit == "none"
    # Same hardware, other torch minor: sound, but marked for re-verification before it serves.
    from dataclasses import replace

    later = replace(here, torch_version="9.9.0")
    report = verify_pack(good_pack, fingerprint=later)
    assert report.ok and report.kernels[0].fit == "reverify"
    assert any("verifies it again" in w for w in report.warnings), report.warnings


def test_good_pack_is_sound(good_pack, here):
    report = verify_pack(good_pack, fingerprint=here)
    assert report.ok, report.reasons
    manifest = json.loads(__import__("zipfile").ZipFile(good_pack).read("manifest.json"))
    assert manifest["format_version"] == FORMAT_VERSION
