"""The embedding gather + RMSNorm region that opens a Llama block (``norm_embedding__to_copy_pow_mean_add_rsqrt_mul``):
its problem counts the traffic a kernel must move, not the whole vocabulary table, so the judge's roofline gate
lets a correct kernel through on a GPU; and on CPU the region, cut from a model as ``warm`` cuts it, is searched to a
verified kernel from Inductor's seeds under the interpreter judge."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kernel_cache.store import KernelStore
from ks_inductor.evolve import EvolveConfig
from ks_inductor.evolve.evolver import evolve_problem
from ks_inductor.judge import EvalResult, Judge, JudgeConfig
from ks_inductor.warm.sources import problems_from_model
from tests.speed import judge_speed

# A vocabulary far larger than the tokens that index it, as in a real model: the table dwarfs the traffic.
VOCAB, HIDDEN, BATCH, SEQ = 4096, 64, 2, 16
# int64 ids and the bf16 norm weight read, the two bf16 outputs written.
NEEDED_BYTES = BATCH * SEQ * 8 + HIDDEN * 2 + 2 * BATCH * SEQ * HIDDEN * 2


class EmbedNorm(nn.Module):
    """The embedding and first RMSNorm of a Llama block (transformers' LlamaRMSNorm), returning the hidden states
    the residual keeps and the normalized ones."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.weight = nn.Parameter(torch.randn(HIDDEN))
        self.eps = 1e-6

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(ids)
        xf = h.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return h, self.weight * xf.to(h.dtype)


@pytest.fixture(scope="module")
def region(tmp_path_factory):
    torch.manual_seed(0)
    model = EmbedNorm().to(torch.bfloat16).eval()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    db = f"sqlite:///{tmp_path_factory.mktemp('regions') / 'k.db'}"
    problems = [p for p in problems_from_model(model, (ids,), db=db, judge_backend="triton-interpret")
                if "embedding" in p.op_summary]
    assert len(problems) == 1, [p.name for p in problems]
    return problems[0]


def test_gathered_table_is_not_counted_as_traffic(region):
    """The ids are read, the norm weight is read, both outputs are written; of the table only the gathered rows
    are touched, and which ones (repeats read once) depends on the ids."""
    assert region.signature() == f"int64[{BATCH}, {SEQ}], bfloat16[{VOCAB}, {HIDDEN}], bfloat16[{HIDDEN}]"
    assert region.bytes_moved == NEEDED_BYTES


def test_roofline_gate_passes_a_kernel_above_the_traffic_floor(region):
    """Timed at twice the floor of what it must move, a correct kernel is accepted, although the whole table alone
    would take longer to read than it ran; below that floor the gate still holds it."""
    bandwidth = 1e12
    floor_ms = NEEDED_BYTES / bandwidth * 1e3
    table_ms = VOCAB * HIDDEN * 2 / bandwidth * 1e3
    honest = 2 * floor_ms
    assert honest < 0.9 * table_ms  # counted whole, the table would quarantine it
    eager = [[20 * floor_ms] * 5] * 5
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        judge.backend.timed = True  # feed the gate synthetic GPU samples
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, region, {"samples": {"eager": eager, "candidate": [[honest] * 5] * 5}, "wall": None,
                                       "bandwidth": bandwidth})
        assert r.verdict == "accepted" and r.flags == [], r.reasons
        assert r.roofline_fraction == pytest.approx(0.5)
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, region, {"samples": {"eager": eager, "candidate": [[0.5 * floor_ms] * 5] * 5},
                                       "wall": None, "bandwidth": bandwidth})
        assert r.verdict == "quarantined" and r.flags == ["faster_than_roofline"]


def test_region_gets_a_verified_kernel_on_cpu(region, tmp_path):
    """Inductor's fused gather + norm, judged by the interpreter (int64 ids drawn by the problem, both outputs
    compared), is accepted and stored."""
    store = KernelStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        summary = evolve_problem(region, EvolveConfig(budget=2, backend="triton-interpret"), store, progress=False)
        feedback = [s.feedback for s in store.steps(problem_key=region.key)]
        assert summary.accepted >= 1, feedback
        assert summary.best is not None and summary.best.status == "verified"
        assert [k.source for k in store.kernels(region.key, status="verified")] == [summary.best.source]
    finally:
        store.close()
