"""The offline SASS counter: a template configuration compiled for sm_90 on a machine with no GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

pytestmark = pytest.mark.skipif(not ((BIN / "ptxas").exists() and (BIN / "cuobjdump").exists()),
                                reason="this triton wheel carries no ptxas or cuobjdump")

_SCRIPT = """
import json
from dataclasses import asdict
from benchmarks.sass_counts import counts_for_config
out = {rows: [asdict(c) for c in counts_for_config("ks_inductor/catalogue/problems/layernorm_bf16.py", "rowwise/block",
                                                    {"ROWS": rows, "num_warps": 8})] for rows in (1, 2)}
print(json.dumps(out))
"""


def _compiled(script: str) -> dict:
    """What ``script`` prints last, as JSON, run in a process that compiles kernels (no TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_layernorm_config_compiles_for_hopper_with_the_launch_specializations() -> None:
    out = _compiled(_SCRIPT)
    one, two = out["1"], out["2"]
    assert [k["name"] for k in one] == ["_row_kernel"] and [k["name"] for k in two] == ["_row_kernel"]
    for k in one + two:
        assert 16 <= k["registers"] <= 255
        # The rows are 4096 bf16 wide and 16-byte aligned: with the launch's divisibility hints the loads are
        # vectors; without them ptxas would get one 16-bit load per element.
        assert k["wide_loads"] > 0 and k["narrow_loads"] == 0
        assert k["opcodes"].get("SHFL", 0) > 0  # the row reductions cross lanes
    # Twice the rows over as many threads: more values per thread, more instructions.
    assert one[0]["instructions"] < two[0]["instructions"]


def test_compiling_under_the_interpreter_is_refused_with_a_reason() -> None:
    from benchmarks.sass_counts import counts_for_source

    if not triton.knobs.runtime.interpret:
        pytest.skip("this process runs compiled kernels")
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        counts_for_source("", None, [])


_STAGED = """
import json
from benchmarks.sass_counts import counts_for_config
out = {s: counts_for_config("ks_inductor/catalogue/problems/softmax_bf16.py", "rowwise/persistent",
                            {"num_stages": s})[0].shared_bytes for s in (1, 3)}
print(json.dumps(out))
"""


def test_persistent_row_loop_stages_long_rows_through_shared_memory() -> None:
    """The persistent row-wise variant gives its stages to the row loop, so the compiler copies the next rows
    asynchronously into shared memory: at 3 stages, two 32,768-value bf16 rows of the 32,000-wide softmax. Given
    only to the launch, the stages left the loads in registers (128 bytes of shared memory, the reductions')."""
    shared = _compiled(_STAGED)
    assert shared["3"] >= 2 * 32768 * 2 > 1024 >= shared["1"], shared


_PINNED = """
import json
from benchmarks.sass_counts import counts_for_config
out = {f: counts_for_config("ks_inductor/catalogue/problems/layernorm_bf16.py", "rowwise/block",
                            {"ROWS": 2, "num_warps": 8, "EVICT": 1, "VEVICT": 1, "VFIRST": f})[0].loads
       for f in (0, 1)}
print(json.dumps(out))
"""


def test_pinned_vector_loads_are_issued_before_the_rows() -> None:
    """VFIRST=1 keeps a norm's weight and bias loads (evict_last) ahead of the row loads (evict_first) in the
    compiled kernel; unpinned, the compiler sinks them below the rows, to just before the first reduction."""
    loads = _compiled(_PINNED)
    pinned, free = loads["1"], loads["0"]
    for seq in (pinned, free):
        assert sorted(seq) == sorted(pinned) and {op.split(".")[2] for op in seq} == {"EL", "EF"}, seq
    n_vec = sum(".EL" in op for op in pinned)
    assert all(".EL" in op for op in pinned[:n_vec]), pinned
    assert ".EF" in free[0], free  # what the pin is for: without it the vectors come after a row load
