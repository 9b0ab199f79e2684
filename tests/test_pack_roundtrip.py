"""Packs: export -> verify -> import round trips, filters, merge rules, signing, and the CLI."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from kernel_cache.errors import PackError
from kernel_cache.pack import ExportFilters, export_pack, inspect_pack
from kernel_cache.record import QUARANTINED, KernelRecord
from kernel_cache.store import KernelStore
from kernel_cache.testing import forge_kernel_source, h200, make_record
from ks_inductor.judge.packs import import_pack, verify_pack

ROOT = Path(__file__).resolve().parent.parent
RMSNORM_OK = (ROOT / "tests" / "candidates" / "rmsnorm_ok.py").read_text()


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem_tracing import load_problem

    return load_problem(ROOT / "tests" / "problems" / "rmsnorm.py")


@pytest.fixture(scope="module")
def here():
    from ks_inductor.judge.backends import current_fingerprint

    return current_fingerprint("triton-interpret")


def _interp_record(problem, here, tag: str, **kw):
    return make_record(problem.key, tag, here, timed=False, speedup_lcb=None, **kw)


@pytest.fixture
def source_db(tmp_path, problem, here):
    s = KernelStore(str(tmp_path / "source.db"))
    s.upsert_problem(problem)
    s.add_kernel(KernelRecord(problem_key=problem.key, source=RMSNORM_OK, backend=here.backend,
                              fingerprint=here.to_json(), timed=False, op_family="rmsnorm", trials=5,
                              launch_params={"BLOCK": 256}))
    s.add_kernel(_interp_record(problem, here, "copy", op_family="rmsnorm", median_ms=3.0, speedup_graph=0.98))
    s.add_kernel(_interp_record(problem, here, "hidden", status=QUARANTINED))
    yield s
    s.close()


def test_round_trip(tmp_path, source_db, problem, here):
    pack = tmp_path / "out.kspack"
    res = export_pack(source_db, pack)
    assert (res.kernels, res.problems, res.with_vectors, res.signed) == (2, 1, 1, False)
    with zipfile.ZipFile(pack) as zf:
        names = set(zf.namelist())
        assert not any(n.endswith((".pkl", ".pt", ".pickle")) for n in names)
        assert {"manifest.json", "kernels/00000.py", "kernels/00000.json", "vectors/00000.safetensors"} <= names
        manifest = json.loads(zf.read("manifest.json"))
        from safetensors.torch import load

        vec = load(zf.read("vectors/00000.safetensors"))
    assert manifest["format_version"] == 1 and manifest["torch_version"] and manifest["triton_version"]
    assert set(manifest["entries"]) == names - {"manifest.json"}
    assert set(manifest["fingerprints"]) == {here.id}
    # Golden outputs are the reference's outputs on the golden inputs, with the reference's seeded weights.
    x, w, y = vec["v0.in0"], vec["state.weight"], vec["v0.out0"]
    ref = (x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()) * w
    assert list(x.shape) == problem.input_specs[0].shape and (ref - y).abs().max() < 1e-5

    report = verify_pack(pack, fingerprint=here)
    assert report.ok, report.reasons
    assert [k.fit for k in report.kernels] == ["exact", "exact"]

    with KernelStore(str(tmp_path / "dest.db")) as dest:
        result = import_pack(pack, dest, fingerprint=here)
        assert (result.added, result.kept, result.problems) == (2, 0, 1)
        assert dest.get_problem(problem.key) == problem
        src_rows = {r.sha256: r for r in source_db.kernels(status="verified")}
        for r in dest.kernels():
            s = src_rows[r.sha256]
            assert (r.source, r.fingerprint, r.status, r.launch_params, r.median_ms, r.timed, r.op_family) == (
                s.source, s.fingerprint, s.status, s.launch_params, s.median_ms, s.timed, s.op_family)
        assert dest.lookup(problem.key, here).sha256 == source_db.lookup(problem.key, here).sha256
        again = import_pack(pack, dest, fingerprint=here)
        assert (again.added, again.kept) == (0, 2)
        assert len(dest.kernels()) == 2


def test_export_filters(tmp_path, problem):
    fp = h200()
    with KernelStore(str(tmp_path / "k.db")) as s:
        s.upsert_problem(problem)
        s.add_kernel(make_record(problem.key, "a", fp, speedup_lcb=1.05, op_family="rmsnorm"))
        s.add_kernel(make_record(problem.key, "b", fp, speedup_lcb=1.6, op_family="norm2"))
        s.add_kernel(make_record("orphan", "c", fp, speedup_lcb=2.0))

        def exported(**kw):
            res = export_pack(s, tmp_path / "f.kspack", ExportFilters(**kw), vectors=False)
            return res.kernels

        assert exported(keys=[problem.key]) == 2
        assert exported(keys=[problem.key], min_speedup=1.5) == 1
        assert exported(op_family="rmsnorm") == 1
        assert exported(keys=[problem.key], fingerprint=fp.hardware_id) == 2
        assert exported(keys=[problem.key], fingerprint=fp.id) == 2
        with pytest.raises(PackError, match="no kernels match"):
            exported(fingerprint="0123456789abcdef")
        with pytest.raises(PackError, match="has none|have none|problem"):
            exported()  # "orphan" has no problem row: a pack must carry every kernel's problem


def test_merge_keeps_verified_and_local_verdicts(tmp_path, problem):
    fp = h200()
    with KernelStore(str(tmp_path / "local.db")) as local, KernelStore(str(tmp_path / "remote.db")) as remote:
        for s in (local, remote):
            s.upsert_problem(problem)
        mine = local.add_kernel(make_record(problem.key, "shared", fp, speedup_lcb=1.2))
        # The remote side has the same kernel, but quarantined there, plus a faster and a slower one.
        remote.add_kernel(make_record(problem.key, "shared", fp, speedup_lcb=1.2, status=QUARANTINED))
        remote.add_kernel(make_record(problem.key, "faster", fp, speedup_lcb=1.8))
        remote.add_kernel(make_record(problem.key, "slower", fp, speedup_lcb=1.1))
        pack = tmp_path / "r.kspack"
        export_pack(remote, pack, ExportFilters(status=QUARANTINED), vectors=False)
        res = import_pack(pack, local, fingerprint=fp)
        assert [(o.action, o.kernel_id) for o in res.outcomes] == [("kept", mine)]
        assert local.get_kernel(mine).status == "verified"  # never replaced by an unverified entry

        export_pack(remote, pack, vectors=False)
        res = import_pack(pack, local, fingerprint=fp)
        by_tag = {o.record.source.split("variant ")[1].split('"')[0]: o for o in res.outcomes}
        assert by_tag["faster"].action == "added" and by_tag["faster"].best
        assert by_tag["slower"].action == "added" and not by_tag["slower"].best
        assert local.lookup(problem.key, fp).id == by_tag["faster"].kernel_id


def test_signing(tmp_path, source_db, here):
    from kernel_cache.signing import generate_keypair

    priv, pub = generate_keypair(tmp_path / "team")
    _, other_pub = generate_keypair(tmp_path / "other")
    signed, unsigned = tmp_path / "s.kspack", tmp_path / "u.kspack"
    assert export_pack(source_db, signed, sign_key=priv, vectors=False).signed
    export_pack(source_db, unsigned, vectors=False)

    ok = verify_pack(signed, trust_keys=[str(pub)], fingerprint=here)
    assert ok.ok and ok.signature_checked
    raw_b64 = _raw_public_b64(pub)
    assert verify_pack(signed, trust_keys=[raw_b64], fingerprint=here).ok  # inline key form
    assert any("not checked" in w for w in verify_pack(signed, fingerprint=here).warnings)

    wrong = verify_pack(signed, trust_keys=[str(other_pub)], fingerprint=here)
    assert not wrong.ok and "does not verify" in " ".join(wrong.reasons)
    bare = verify_pack(unsigned, trust_keys=[str(pub)], fingerprint=here)
    assert not bare.ok and "unsigned" in " ".join(bare.reasons)

    # Re-hashing a changed entry into the manifest keeps the hashes consistent, but breaks the signature.
    forged = tmp_path / "forged.kspack"
    forge_kernel_source(signed, forged, 0, RMSNORM_OK + "\n# forged\n")
    assert verify_pack(forged, fingerprint=here).ok
    assert not verify_pack(forged, trust_keys=[str(pub)], fingerprint=here).ok
    with KernelStore(str(tmp_path / "d.db")) as dest, pytest.raises(PackError, match="refused"):
        import_pack(forged, dest, trust_keys=[str(pub)], fingerprint=here)


def _raw_public_b64(pub: Path) -> str:
    import base64

    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(pub.read_bytes())
    return base64.b64encode(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def test_cli(tmp_path, source_db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich would otherwise squeeze the tables to 80 columns
    from ks_inductor.cli import main

    db = source_db.where
    pack = str(tmp_path / "cli.kspack")

    def run(*argv):
        code = main(list(argv))
        return code, capsys.readouterr()

    code, out = run("pack", "export", "--db", db, "-o", pack, "--json")
    assert code == 0 and json.loads(out.out)["kernels"] == 2
    code, out = run("pack", "inspect", pack)
    assert code == 0 and "rmsnorm" in out.out and "unsigned" in out.out
    assert inspect_pack(pack).manifest["format"] == "kernelsmith-pack"
    # stored by hand, without judged plans: they are not served, and the table says so per kernel
    kernels = inspect_pack(pack).manifest["kernels"]
    assert [k["judged_plan"] for k in kernels] == [False, False]
    assert out.out.count("none: not served") >= 2
    # each kernel's figure inside a CUDA graph beside its per-call one, where it was timed in one
    assert sorted(k["speedup_graph"] or 0 for k in kernels) == [0, 0.98] and " 0.98x " in out.out
    code, out = run("pack", "verify", pack, "--backend", "triton-interpret", "--json")
    verified = json.loads(out.out)
    assert code == 0 and verified["ok"]
    assert sum("carries no judged plan, so no stack serves it" in w for w in verified["warnings"]) == 2, verified
    dest = str(tmp_path / "dest.db")
    code, out = run("pack", "import", pack, "--db", dest, "--backend", "triton-interpret", "--json")
    assert code == 0 and json.loads(out.out)["added"] == 2

    code, out = run("cache", "ls", "--db", dest, "--json")
    rows = json.loads(out.out)
    assert code == 0 and len(rows) == 2 and all("source" not in r for r in rows)
    code, out = run("cache", "ls", "--db", dest)
    assert code == 0 and "verified" in out.out
    code, out = run("cache", "show", str(rows[0]["id"]), "--db", dest)
    assert code == 0 and "@triton.jit" in out.out
    code, out = run("cache", "stats", "--db", dest, "--json")
    assert code == 0 and json.loads(out.out)["kernels_by_status"] == {"verified": 2}
    code, out = run("cache", "gc", "--db", dest, "--keep", "1", "--dry-run", "--json")
    assert code == 0 and len(json.loads(out.out)["deleted"]) == 1
    code, out = run("cache", "rm", str(rows[0]["id"]), "--db", dest)
    assert code == 0
    code, out = run("cache", "show", str(rows[0]["id"]), "--db", dest)
    assert code == 2 and "no kernel" in out.err

    Path(pack).write_bytes(Path(pack).read_bytes()[:500])
    code, out = run("pack", "verify", pack, "--backend", "triton-interpret")
    assert code == 1 and "refused" in out.out
    code, out = run("pack", "import", pack, "--db", dest, "--backend", "triton-interpret")
    assert code == 1 and "truncated" in out.err


def test_oversized_vectors_are_omitted_and_recorded(tmp_path, source_db, here):
    pack = tmp_path / "novec.kspack"
    res = export_pack(source_db, pack, vector_cap_bytes=1024)
    assert res.with_vectors == 0 and "over the" in next(iter(res.without_vectors.values()))
    manifest = inspect_pack(pack).manifest
    assert all(k["vectors"] == "none" for k in manifest["kernels"])
    assert "MiB" in manifest["problems"][0]["vectors_note"]
    assert verify_pack(pack, fingerprint=here).ok


def _damage_entry(src: Path, dst: Path, name: str) -> None:
    """A copy of ``src`` whose ``name`` entry's bytes are flipped in place: the zip's directory still lists it."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo(name)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start, start + min(8, info.compress_size)):
        data[i] ^= 0xFF
    dst.write_bytes(bytes(data))


def test_key_files_and_damaged_signatures_through_the_command(tmp_path, source_db, capsys):
    from kernel_cache.signing import generate_keypair
    from ks_inductor.cli import main
    from tests.cli_parsing import one_line_error

    priv, pub = generate_keypair(tmp_path / "team")
    signed = tmp_path / "s.kspack"
    export_pack(source_db, signed, sign_key=priv, vectors=False)
    verify = ["pack", "verify", str(signed), "--backend", "triton-interpret"]

    # A private key given where a public one is trusted, and a key file that is not there: usage errors.
    assert main([*verify, "--trust-key", str(priv)]) == 2
    assert f"trusted key {priv} is a private key" in one_line_error(capsys)
    assert main([*verify, "--trust-key", str(tmp_path / "nokey.pub")]) == 2
    assert f"trusted key file not found: {tmp_path / 'nokey.pub'}" in one_line_error(capsys)
    assert main(["pack", "export", "--db", source_db.where, "-o", str(tmp_path / "o.kspack"),
                 "--sign-key", str(tmp_path / "nokey.pem")]) == 2
    assert f"signing key not found: {tmp_path / 'nokey.pem'}" in one_line_error(capsys)
    assert main([*verify, "--trust-key", str(pub)]) == 0
    capsys.readouterr()

    # A signed pack whose signature entry is damaged is not an unsigned one.
    damaged = tmp_path / "d.kspack"
    _damage_entry(signed, damaged, "manifest.sig")
    assert main(["pack", "verify", str(damaged), "--backend", "triton-interpret", "--trust-key", str(pub)]) == 1
    out = capsys.readouterr().out
    assert "manifest.sig is damaged" in out and "unsigned" not in out, out
    # A pack too damaged to be read says so, not that it is unsigned.
    truncated = tmp_path / "t.kspack"
    truncated.write_bytes(signed.read_bytes()[:600])
    assert main(["pack", "verify", str(truncated), "--backend", "triton-interpret"]) == 1
    out = capsys.readouterr().out
    assert "signature: not read: the pack is damaged" in out and "unsigned" not in out, out
