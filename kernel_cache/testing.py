"""Factories for tests and benchmarks: fingerprints, problem records and kernel records that look like the
judge's."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Callable
from typing import Any

from kernel_cache.record import VERIFIED, KernelRecord
from ks_core.fingerprint import BACKEND_CPU_INTERPRET, BACKEND_CUDA, EnvFingerprint
from ks_core.problem_record import InputSpec, Problem


def h200(torch_version: str = "2.11.0+cu130", triton_version: str = "3.6.0") -> EnvFingerprint:
    return EnvFingerprint(BACKEND_CUDA, "NVIDIA H200", "sm_90", 32, 132, torch_version, triton_version, "cuda-13.0")


def a100() -> EnvFingerprint:
    return EnvFingerprint(BACKEND_CUDA, "NVIDIA A100-SXM4-80GB", "sm_80", 32, 108, "2.11.0+cu130", "3.6.0",
                          "cuda-13.0")


def interpreter(torch_version: str = "2.13.0+cpu", triton_version: str = "3.9.0") -> EnvFingerprint:
    return EnvFingerprint(BACKEND_CPU_INTERPRET, "cpu:x86_64", "interpret", 1, 1, torch_version, triton_version,
                          "triton-interpreter")


def kernel_source(tag: str) -> str:
    """A small, statically clean kernel module; ``tag`` makes each source (and its sha256) distinct."""
    return f'''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    """variant {tag}"""

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        _copy_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
'''


def make_problem(key: str = "k" * 32) -> Problem:
    """A plain problem record (x + 1 on a 4x8 float32 tensor) under ``key``, as the cache stores one."""
    return Problem(name="add1", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                   "        return x + 1\ndef get_inputs():\n    return [torch.randn(4, 8)]\n", key=key,
                   input_specs=[InputSpec("tensor", [4, 8], "float32", [8, 1])], init_inputs=[],
                   op_summary={"add": 1}, bytes_moved=256, flops=32)


def make_record(problem_key: str, tag: str, fingerprint: EnvFingerprint | None = None, **kw: Any) -> KernelRecord:
    fp = fingerprint or h200()
    defaults: dict[str, Any] = {"status": VERIFIED, "median_ms": 1.0, "speedup_lcb": 1.1, "trials": 5,
                                "timed": fp.timed, "launch_params": {"BLOCK": 1024, "num_warps": 4}}
    defaults.update(kw)
    return KernelRecord(problem_key=problem_key, source=kernel_source(tag), backend=fp.backend,
                        fingerprint=fp.to_json(), **defaults)


def rewrite_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                 changes: dict[str, Callable[[bytes], bytes | None]], *, rehash: bool = False,
                 manifest_edit: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Copy a pack, changing entries (a change returning None drops the entry; a name not in the pack is added
    from ``changes[name](b"")``). ``rehash`` rewrites the manifest's hashes to match, as a forger would."""
    with zipfile.ZipFile(src) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    for name, fn in changes.items():
        new = fn(entries.get(name, b""))
        if new is None:
            entries.pop(name, None)
        else:
            entries[name] = new
    if (rehash or manifest_edit) and "manifest.json" in entries:
        manifest = json.loads(entries["manifest.json"])
        if rehash:
            manifest["entries"] = {n: hashlib.sha256(b).hexdigest() for n, b in entries.items()
                                   if n not in ("manifest.json", "manifest.sig")}
        if manifest_edit:
            manifest_edit(manifest)
        entries["manifest.json"] = json.dumps(manifest, sort_keys=True, indent=1).encode()
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)


def forge_kernel_source(src: str | os.PathLike[str], dst: str | os.PathLike[str], index: int, new_source: str) -> None:
    """Swap kernel ``index``'s source and fix up every hash that covers it, as a forger without the signing key
    would: the pack stays self-consistent, so only the signature or the safety rules can catch it."""
    from kernel_cache.record import source_sha256

    sha = source_sha256(new_source)
    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        entry = manifest["kernels"][index]
        meta = json.loads(zf.read(entry["meta"]))
    meta["sha256"] = sha

    def edit(m: dict[str, Any]) -> None:
        m["kernels"][index]["sha256"] = sha

    rewrite_pack(src, dst, {entry["source"]: lambda _: new_source.encode(),
                            entry["meta"]: lambda _: json.dumps(meta, sort_keys=True, indent=1).encode()},
                 rehash=True, manifest_edit=edit)
