"""Kernel cache packs (``.kspack``): verified kernels, their problems and golden vectors in one zip.

Layout::

    manifest.json            format and versions, fingerprints, the sha256 of every other entry, the index
    manifest.sig             optional ed25519 signature over manifest.json's bytes
    problems/NNNNN.json      Problem.to_json() (the reference source, key, input specs)
    kernels/NNNNN.py         a kernel's source, as text a reviewer can read
    kernels/NNNNN.json       its KernelRecord metadata (without the source)
    vectors/NNNNN.safetensors  golden vectors for problem NNNNN: inputs, reference outputs, reference weights

No pickle anywhere: JSON and safetensors only. Nothing from a pack runs in this process: kernels only ever run in
the judge's sandboxed workers (``verify --run``), and a pack's reference sources are stored, never executed,
here. A pack is refused as a whole on any finding; importing is one transaction, so a refused or failed import
leaves the database as it was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import posixpath
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_cache.errors import PackError
from kernel_cache.migrations import rank_of
from kernel_cache.record import RACE, VERIFIED, KernelRecord, source_sha256
from kernel_cache.store import KernelStore, MergeOutcome
from ks_core.fingerprint import MATCH_EXACT, MATCH_NONE, EnvFingerprint, match
from ks_core.problem_record import Problem

log = logging.getLogger(__name__)

PACK_FORMAT = "kernelsmith-pack"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
VECTOR_CAP_BYTES = 8 * 2**20  # per problem; larger problems ship without vectors (recorded as such)
N_VECTORS = 2
MAX_ENTRY_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 2 * 2**30
_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                "int8": 1, "uint8": 1, "bool": 1}


# ============================================================================================ results


@dataclass
class ExportFilters:
    keys: list[str] | None = None
    op_family: str | None = None
    fingerprint: str | None = None  # a fingerprint id or a hardware id
    min_speedup: float | None = None  # for verified kernels: a race kernel's figure is the load-time race's
    # Verified kernels, and those a serving stack's load-time race decides (``record.RACE``).
    status: str | tuple[str, ...] = (VERIFIED, RACE)


@dataclass
class ExportResult:
    path: str
    kernels: int
    problems: int
    with_vectors: int
    without_vectors: dict[str, str] = field(default_factory=dict)  # problem key -> why no vectors
    signed: bool = False
    size_bytes: int = 0
    seconds: float = 0.0


@dataclass
class KernelCheck:
    index: int
    problem_key: str
    sha256: str
    fingerprint: str = ""  # short description
    fit: str = ""  # exact | reverify | none
    vectors: str = "not run"  # passed | failed | not run | none
    reasons: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    path: str
    reasons: list[str] = field(default_factory=list)  # any reason means the pack is refused
    warnings: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    signed: bool = False
    signature_checked: bool = False
    kernels: list[KernelCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


@dataclass
class ImportResult:
    path: str
    report: VerifyReport
    outcomes: list[MergeOutcome]
    problems: int
    seconds: float = 0.0

    @property
    def added(self) -> int:
        return sum(o.action == "added" for o in self.outcomes)

    @property
    def kept(self) -> int:
        return sum(o.action == "kept" for o in self.outcomes)


@dataclass
class PackContents:
    """A verified pack, parsed."""

    manifest: dict[str, Any]
    problems: list[Problem]
    kernels: list[KernelRecord]
    vectors: dict[str, bytes]  # problem key -> safetensors bytes


# ============================================================================================ export


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _versions() -> dict[str, str]:
    import torch
    import triton

    from ks_core.version import __version__

    return {"kernelsmith_version": __version__, "torch_version": torch.__version__,
            "triton_version": triton.__version__, "python_version": platform.python_version()}


def _estimate_bytes(problem: Problem) -> int | None:
    total = 0
    for s in list(problem.input_specs) + list(problem.output_specs):
        if s.kind != "tensor":
            continue
        if s.dtype not in _DTYPE_BYTES:
            return None
        total += math.prod(s.shape or []) * _DTYPE_BYTES[s.dtype]
    return total


def golden_vectors(problem: Problem, n: int = N_VECTORS, cap_bytes: int = VECTOR_CAP_BYTES,
                   device: str = "cpu") -> tuple[bytes | None, str]:
    """Inputs at the problem's own shapes (seeded, on CPU) and the trusted reference's outputs, computed on
    ``device``, as safetensors.

    Returns (bytes, "") or (None, why not). The reference is this database's own trusted problem source. Kernels
    for a GPU are judged against the reference run on the GPU, whose 16-bit rounding can differ from the CPU's by
    an ulp: their vectors are made on the GPU where there is one, else a kernel the judge passed can miss them.
    """
    import torch
    from safetensors.torch import save

    if any(s.kind != "tensor" for s in problem.input_specs):
        return None, "the problem takes non-tensor inputs, which golden vectors cannot carry"
    est = _estimate_bytes(problem)
    if est is not None and est * n > cap_bytes:
        return None, f"inputs and outputs take {est * n / 2**20:.1f} MiB, over the {cap_bytes / 2**20:.0f} MiB cap"
    try:
        # fork_rng: seeding here must not disturb the caller's random streams.
        with torch.random.fork_rng(devices=[]):
            try:
                tensors, init, n_out, strides = _run_reference(problem, n, device)
            except torch.cuda.OutOfMemoryError:
                tensors, init, n_out, strides = _run_reference(problem, n, "cpu")
    except _NoVectors as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a reference that will not run on CPU: no vectors
        return None, f"the reference did not run on CPU: {type(e).__name__}: {e}"
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if size > cap_bytes:
        return None, f"vectors take {size / 2**20:.1f} MiB, over the {cap_bytes / 2**20:.0f} MiB cap"
    try:
        meta = {"n_vectors": str(n), "n_outputs": str(n_out), "init_inputs": json.dumps(init),
                "problem_key": problem.key}
        if strides:
            meta["strides"] = json.dumps(strides)
    except TypeError:
        return None, "get_init_inputs() returns values JSON cannot carry"
    return save(tensors, metadata=meta), ""


def _vector_device(records: list[Any]) -> str:
    """Where a problem's golden outputs are computed: on this machine's GPU when its kernels are for one."""
    import torch

    from ks_core.fingerprint import BACKEND_CPU_INTERPRET

    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return "cpu"
    return "cpu" if any(r.backend == BACKEND_CPU_INTERPRET for r in records) else "cuda"


class _NoVectors(Exception):
    pass


def _run_reference(problem: Problem, n: int, device: str = "cpu") -> tuple[dict[str, Any], list[Any], int,
                                                                       dict[str, list[int]]]:
    import torch

    from ks_core.problem_record import exec_problem_source

    mod = exec_problem_source(problem.source, f"<problem {problem.key}>")
    torch.manual_seed(0)
    init = list(mod.get_init_inputs())
    model = mod.Model(*init).eval()
    tensors: dict[str, torch.Tensor] = {f"state.{k}": v.detach().cpu().contiguous()
                                        for k, v in model.state_dict().items()}
    model = model.to(device)
    n_out = 0
    # safetensors holds dense tensors only: an input laid out otherwise (a transposed view, as an attention's q
    # and k are) is carried dense with the strides it is laid out again at, since a kernel may assume them.
    strides: dict[str, list[int]] = {}
    for i in range(n):
        torch.manual_seed(1000 + i)
        inputs = list(mod.get_inputs())
        if not all(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in inputs):
            raise _NoVectors("get_inputs() does not return CPU tensors only")
        with torch.no_grad():
            out = model(*[x.to(device, copy=True) for x in inputs])
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        n_out = len(outs)
        for j, x in enumerate(inputs):
            tensors[f"v{i}.in{j}"] = x.contiguous()
            if not x.is_contiguous():
                strides[f"v{i}.in{j}"] = list(x.stride())
        for j, o in enumerate(outs):
            tensors[f"v{i}.out{j}"] = o.detach().cpu().contiguous()
    return tensors, init, n_out, strides


def export_pack(store: KernelStore, path: str | os.PathLike[str], filters: ExportFilters | None = None, *,
                sign_key: str | os.PathLike[str] | None = None, vectors: bool = True,
                vector_cap_bytes: int = VECTOR_CAP_BYTES) -> ExportResult:
    """Write the kernels matching ``filters`` to a pack at ``path`` (atomically: a temp file, then rename)."""
    t0 = time.perf_counter()
    f = filters or ExportFilters()
    fp_id = hw_id = None
    if f.fingerprint:
        fp_id = f.fingerprint if any(r for r in store.kernels(fingerprint_id=f.fingerprint, limit=1)) else None
        hw_id = None if fp_id else f.fingerprint
    records: list[KernelRecord] = []
    for status in [f.status] if isinstance(f.status, str) else f.status:
        records += store.kernels(keys=f.keys, status=status, op_family=f.op_family, fingerprint_id=fp_id,
                                 hardware_id=hw_id, min_speedup=None if status == RACE else f.min_speedup)
    records.sort(key=lambda r: r.problem_key)
    if not records:
        raise PackError("no kernels match the filters; nothing to export (see `kernelsmith cache ls`)")
    keys = sorted({r.problem_key for r in records})
    problems = {p.key: p for p in store.problems(keys)}
    missing = [k for k in keys if k not in problems]
    if missing:
        raise PackError("a pack must carry each kernel's problem, but these keys have none in the database "
                        "(upsert_problem them first): " + ", ".join(missing[:10]))

    entries: dict[str, bytes] = {}
    manifest: dict[str, Any] = {"format": PACK_FORMAT, "format_version": FORMAT_VERSION,
                                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **_versions(),
                                "filters": {k: v for k, v in vars(f).items() if v is not None},
                                "fingerprints": {}, "problems": [], "kernels": []}
    result = ExportResult(path=str(path), kernels=len(records), problems=len(keys), with_vectors=0)
    problem_index: dict[str, dict[str, Any]] = {}
    for j, key in enumerate(keys):
        p = problems[key]
        name = f"problems/{j:05d}.json"
        entries[name] = json.dumps(p.to_json(), sort_keys=True, indent=1).encode()
        entry: dict[str, Any] = {"key": key, "name": p.name, "file": name, "vectors": None, "vectors_note": ""}
        if vectors:
            blob, why = golden_vectors(p, cap_bytes=vector_cap_bytes, device=_vector_device(
                [r for r in records if r.problem_key == key]))
        else:
            blob, why = None, "exported without vectors (--no-vectors)"
        if blob is not None:
            entry["vectors"] = f"vectors/{j:05d}.safetensors"
            entries[entry["vectors"]] = blob
            result.with_vectors += 1
        else:
            entry["vectors_note"] = why
            result.without_vectors[key] = why
        manifest["problems"].append(entry)
        problem_index[key] = entry
    for i, rec in enumerate(records):
        fp = EnvFingerprint.from_json(rec.fingerprint)
        manifest["fingerprints"][fp.id] = fp.to_json()
        src, meta = f"kernels/{i:05d}.py", f"kernels/{i:05d}.json"
        entries[src] = rec.source.encode()
        data = rec.to_json()
        for k in ("source", "id"):
            data.pop(k)
        entries[meta] = json.dumps(data, sort_keys=True, indent=1).encode()
        manifest["kernels"].append({
            "source": src, "meta": meta, "problem_key": rec.problem_key, "sha256": rec.sha256,
            "fingerprint_id": fp.id, "status": rec.status, "op_family": rec.op_family,
            "speedup": rank_of(rec.speedup_lcb, rec.speedup_inductor, rec.speedup_eager),
            "median_ms": rec.median_ms, "timed": rec.timed, "speedup_graph": rec.speedup_graph,
            # whether it serves at its problem's signature from the plan its verdict was reached with
            "judged_plan": bool(rec.plan),
            "vectors": problem_index[rec.problem_key]["vectors"] or "none"})
    manifest["entries"] = {name: _sha(data) for name, data in sorted(entries.items())}
    manifest_bytes = json.dumps(manifest, sort_keys=True, indent=1).encode()
    sig = None
    if sign_key is not None:
        from kernel_cache.signing import sign_manifest

        sig = sign_manifest(manifest_bytes, sign_key)
        result.signed = True

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kspack-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(MANIFEST, manifest_bytes)
            if sig is not None:
                zf.writestr(SIGNATURE, sig)
            for name, data in entries.items():
                # safetensors of random floats barely compress; storing them saves the time.
                zf.writestr(name, data, compress_type=zipfile.ZIP_STORED if name.startswith("vectors/") else None)
        # mkstemp makes the file private (0600); a pack is meant to be shared, so it gets the mode any other file
        # written here would: the umask's.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    result.size_bytes = out.stat().st_size
    result.seconds = time.perf_counter() - t0
    return result


# ============================================================================================ reading


class _Refused(Exception):
    """Stops verification early; the reasons are already in the report."""


def _safe_name(name: str) -> bool:
    return (bool(name) and not name.startswith("/") and "\\" not in name and ".." not in name.split("/")
            and posixpath.normpath(name) == name)


def _read_entries(path: Path, report: VerifyReport) -> dict[str, bytes]:
    if not path.is_file():
        report.reasons.append(f"{path}: no such file")
        raise _Refused
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            # Signed is what the pack's directory says, so that a damaged signature reads as damaged, not absent.
            report.signed = SIGNATURE in names
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                report.reasons.append(f"duplicate entries (a tampering sign): {', '.join(dupes[:5])}")
            bad = [n for n in names if not _safe_name(n)]
            if bad:
                report.reasons.append(f"unsafe entry names: {', '.join(bad[:5])}")
            big = [i.filename for i in infos if i.file_size > MAX_ENTRY_BYTES]
            if big or sum(i.file_size for i in infos) > MAX_TOTAL_BYTES:
                report.reasons.append(f"entries too large to be a kernel pack (limit {MAX_ENTRY_BYTES >> 20} MiB "
                                      f"each, {MAX_TOTAL_BYTES >> 30} GiB in all): {', '.join(big[:5])}")
            if report.reasons:
                raise _Refused
            out = {}
            for info in infos:
                if info.is_dir():
                    continue
                try:
                    out[info.filename] = zf.read(info)
                except (zipfile.BadZipFile, zlib.error) as e:
                    report.reasons.append(f"entry {info.filename} is damaged: {e}")
            return out
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        report.reasons.append(f"{path} is not a readable zip (truncated or damaged?): {e}")
        raise _Refused from None


def _load_manifest(entries: dict[str, bytes], report: VerifyReport) -> tuple[dict[str, Any], bytes]:
    raw = entries.get(MANIFEST)
    if raw is None:
        report.reasons.append(f"no {MANIFEST}: this is not a kernelsmith pack (or it lost its manifest)")
        raise _Refused
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        report.reasons.append(f"{MANIFEST} is not valid JSON: {e}")
        raise _Refused from None
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        report.reasons.append(f"{MANIFEST} does not describe a {PACK_FORMAT} (format={manifest.get('format')!r})"
                              if isinstance(manifest, dict) else f"{MANIFEST} is not an object")
        raise _Refused
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        report.reasons.append(f"format_version {version!r} is not a positive integer")
        raise _Refused
    if version > FORMAT_VERSION:
        report.reasons.append(
            f"pack format version {version} was written by a newer kernelsmith "
            f"({manifest.get('kernelsmith_version', '?')}); this one reads up to version {FORMAT_VERSION}. "
            "Upgrade kernelsmith to use it.")
        raise _Refused
    report.manifest = manifest
    for k in ("entries", "fingerprints"):
        if not isinstance(manifest.get(k), dict):
            report.reasons.append(f"{MANIFEST} lacks its '{k}' table")
    for k in ("problems", "kernels"):
        if not isinstance(manifest.get(k), list):
            report.reasons.append(f"{MANIFEST} lacks its '{k}' list")
    if report.reasons:
        raise _Refused
    return manifest, raw


def _check_signature(entries: dict[str, bytes], raw_manifest: bytes, trust_keys: list[Any] | None,
                     report: VerifyReport) -> None:
    sig = entries.get(SIGNATURE)
    if trust_keys:
        from kernel_cache.signing import check_signature, load_public_key

        keys = [load_public_key(k) for k in trust_keys]
        if sig is None:
            report.reasons.append("the pack is unsigned, but --trust-key requires a signature by a trusted key")
            return
        why = check_signature(raw_manifest, sig, keys)
        if why:
            report.reasons.append(f"bad signature: {why}")
        else:
            report.signature_checked = True
    elif report.signed:
        report.warnings.append("the pack is signed, but no --trust-key was given: the signature was not checked")


def _check_hashes(entries: dict[str, bytes], manifest: dict[str, Any], report: VerifyReport) -> None:
    listed: dict[str, str] = manifest["entries"]
    for name, data in entries.items():
        if name in (MANIFEST, SIGNATURE):
            continue
        if name not in listed:
            report.reasons.append(f"entry {name} is not listed in the manifest (added after export?)")
        elif _sha(data) != listed[name]:
            report.reasons.append(f"entry {name} changed: its sha256 does not match the manifest")
    for name in listed:
        if name not in entries:
            report.reasons.append(f"entry {name} is listed in the manifest but missing from the pack")


def _parse(entries: dict[str, bytes], manifest: dict[str, Any], report: VerifyReport) -> PackContents:

    problems, by_key, vectors = [], {}, {}
    for pe in manifest["problems"]:
        try:
            p = Problem.from_json(json.loads(entries[pe["file"]]))
        except (KeyError, TypeError, ValueError) as e:
            report.reasons.append(f"problem entry {pe!r:.80} cannot be read: {type(e).__name__}: {e}")
            continue
        if p.key != pe.get("key"):
            report.reasons.append(f"{pe['file']}: its key {p.key} differs from the manifest's {pe.get('key')}")
            continue
        problems.append(p)
        by_key[p.key] = pe
        if pe.get("vectors"):
            blob = entries.get(pe["vectors"])
            if blob is None:
                report.reasons.append(f"vectors {pe['vectors']} for {p.key} are missing")
                continue
            try:
                from safetensors.torch import load

                load(blob)
            except Exception as e:  # noqa: BLE001 - any parse failure means a damaged file
                report.reasons.append(f"vectors {pe['vectors']} are not valid safetensors: {e}")
                continue
            vectors[p.key] = blob
    kernels = []
    for i, ke in enumerate(manifest["kernels"]):
        check = KernelCheck(index=i, problem_key=str(ke.get("problem_key")), sha256=str(ke.get("sha256")))
        report.kernels.append(check)
        try:
            source = entries[ke["source"]].decode()
            meta = json.loads(entries[ke["meta"]])
            rec = KernelRecord.from_json({**meta, "source": source, "id": None})
            fp = EnvFingerprint.from_json(manifest["fingerprints"][ke["fingerprint_id"]])
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
            check.reasons.append(f"kernel {i}: entry cannot be read: {type(e).__name__}: {e}")
            continue
        check.fingerprint = fp.short()
        if source_sha256(source) != ke["sha256"] or rec.sha256 != ke["sha256"]:
            check.reasons.append(f"kernel {i}: source sha256 differs from the recorded one")
        if EnvFingerprint.from_json(rec.fingerprint) != fp or fp.id != ke["fingerprint_id"]:
            check.reasons.append(f"kernel {i}: fingerprint differs between its metadata and the manifest")
        if rec.problem_key != ke["problem_key"] or rec.problem_key not in by_key:
            check.reasons.append(f"kernel {i}: its problem {rec.problem_key} is not in the pack")
        kernels.append(rec)
    for c in report.kernels:
        report.reasons.extend(c.reasons)
    return PackContents(manifest=manifest, problems=problems, kernels=kernels, vectors=vectors)


def check_fit(contents: PackContents, current: EnvFingerprint, report: VerifyReport) -> None:
    for check, rec in zip(report.kernels, contents.kernels):
        fp = EnvFingerprint.from_json(rec.fingerprint)
        fit = match(fp, current)
        if not rec.timed and current.timed:
            fit = MATCH_NONE
        check.fit = fit
        if fit == MATCH_NONE:
            msg = (f"kernel {check.index} ({rec.problem_key[:12]}) was verified on {fp.short()}, which does not "
                   f"fit this machine ({current.short()}); export a pack for this hardware")
            check.reasons.append(msg)
            report.reasons.append(msg)
        elif fit != MATCH_EXACT:
            report.warnings.append(
                f"kernel {check.index} ({rec.problem_key[:12]}) was verified with torch {fp.torch_version} / triton "
                f"{fp.triton_version}; here it will be served only after the judge verifies it again")


def read_pack(path: str | os.PathLike[str], trust_keys: list[Any] | None,
              report: VerifyReport | None = None) -> tuple[VerifyReport, PackContents | None]:
    """The pack's format and integrity: a readable zip, its manifest, the signature (when keys are trusted) and
    every sha256. Returns the report and the parsed contents, or None when the pack is refused. What runs a
    kernel's source or judges it (the static rules, golden vectors) is the judge's: ``ks_inductor.judge.packs``."""
    report = report or VerifyReport(path=str(path))
    try:
        entries = _read_entries(Path(path), report)
        manifest, raw = _load_manifest(entries, report)
        _check_signature(entries, raw, trust_keys, report)
        _check_hashes(entries, manifest, report)
        if report.reasons:
            raise _Refused
        contents = _parse(entries, manifest, report)
        if report.reasons:
            raise _Refused
    except _Refused:
        return report, None
    return report, contents


def golden_inputs(blob: bytes) -> tuple[list[Any], list[tuple[list[Any], list[Any]]], dict[str, Any] | None]:
    """A problem's golden vectors (safetensors bytes) → (init inputs, [(inputs, reference outputs)], the
    reference's state dict or None)."""
    import torch
    from safetensors.torch import load

    tensors = load(blob)
    meta = _safetensors_metadata(blob)
    for name, stride in json.loads(meta.get("strides", "{}")).items():
        dense = tensors.get(name)
        if dense is not None and len(stride) == dense.dim():
            tensors[name] = torch.empty_strided(dense.shape, stride, dtype=dense.dtype).copy_(dense)
    vecs = []
    for i in range(int(meta.get("n_vectors", "0"))):
        ins = [tensors[f"v{i}.in{j}"] for j in range(_count(tensors, f"v{i}.in"))]
        outs = [tensors[f"v{i}.out{j}"] for j in range(_count(tensors, f"v{i}.out"))]
        vecs.append((ins, outs))
    state = {k[len("state."):]: v for k, v in tensors.items() if k.startswith("state.")}
    return json.loads(meta.get("init_inputs", "[]")), vecs, state or None


def _count(tensors: dict[str, Any], prefix: str) -> int:
    n = 0
    while f"{prefix}{n}" in tensors:
        n += 1
    return n


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    n = int.from_bytes(blob[:8], "little")
    return dict(json.loads(blob[8:8 + n]).get("__metadata__") or {})


def merge_contents(report: VerifyReport, contents: PackContents, store: KernelStore,
                   t0: float | None = None) -> ImportResult:
    """Merge an already verified pack (``check_pack``) into ``store`` in one transaction."""
    t0 = time.perf_counter() if t0 is None else t0
    outcomes = store.merge(contents.problems, contents.kernels)
    return ImportResult(path=report.path, report=report, outcomes=outcomes, problems=len(contents.problems),
                        seconds=time.perf_counter() - t0)


@dataclass
class PackInfo:
    path: str
    manifest: dict[str, Any] | None
    signed: bool
    signer: str | None
    size_bytes: int
    problems: dict[str, dict[str, Any]]
    error: str | None = None


def _umask() -> int:
    """This process's umask, read without changing it where Linux tells it (``os.umask`` can only be read by
    setting it, which another thread could see)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def inspect_pack(path: str | os.PathLike[str]) -> PackInfo:
    """Read a pack's manifest for display, without judging it (``verify_pack`` does that)."""
    from kernel_cache.signing import signature_key_id

    p = Path(path)
    size = p.stat().st_size if p.is_file() else 0
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if MANIFEST not in names:
                return PackInfo(str(p), None, False, None, size, {}, f"no {MANIFEST}: not a kernelsmith pack")
            manifest = json.loads(zf.read(MANIFEST))
            sig = zf.read(SIGNATURE) if SIGNATURE in names else None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        return PackInfo(str(p), None, False, None, size, {}, f"not a readable pack: {e}")
    if not isinstance(manifest, dict):
        return PackInfo(str(p), None, False, None, size, {}, f"{MANIFEST} is not an object")
    probs = {pe.get("key"): pe for pe in manifest.get("problems") or [] if isinstance(pe, dict)}
    return PackInfo(str(p), manifest, sig is not None, signature_key_id(sig) if sig else None, size, probs)
