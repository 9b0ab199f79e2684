"""torch.compile(model, backend="kernelsmith") on an MLP, a convolution block and a small transformer block,
against a cache filled by really warming them (the optimizer with the embedded mutator, kernels verified by the
interpreter judge): outputs match eager, hits happen, gradients match in training, batch sizes can change."""

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ks_inductor.compiler import backend as B

# Inductor's CPU compiles spawn a pool of compile workers by default; on a 2-core CI box one thread is faster.
INDUCTOR = {"compile_threads": 1}


class RMS(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


class Block(nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm2 = RMS(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln(x)

        def heads(z):
            return z.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def _models():
    torch.manual_seed(0)
    conv = ConvBlock()
    conv.bn.running_mean.normal_()
    conv.bn.running_var.uniform_(0.5, 2.0)
    return {
        "mlp": (mlp().eval(), [(torch.randn(4, 16),), (torch.randn(6, 16),)]),
        "conv": (conv.eval(), [(torch.randn(2, 3, 8, 8),)]),
        "block": (Block().eval(), [(torch.randn(2, 4, 32),)]),
    }


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """One cache for the module, filled by `warm`: explain each model's regions, evolve each key (budget 2)."""
    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import problems_from_model, warm

    db = str(tmp_path_factory.mktemp("ks") / "kernels.db")
    models = _models()
    problems = []
    for model, input_sets in models.values():
        for inputs in input_sets:
            problems += problems_from_model(model, inputs, db=db)
    store = KernelStore(db)
    summary = warm(problems, store, EvolveConfig(budget=2, backend="triton-interpret", parallel=2, judge_trials=2))
    # warm's own judge follows the run's settings: every stored kernel was checked on the two trials asked for
    trials = {r.trials for r in store.kernels()}
    store.close()
    assert summary.found >= 5, summary.to_json()
    assert trials == {2}, trials
    yield db, models, summary
    B.forget_stores()


def _compile(model, db, **kw):
    torch._dynamo.reset()
    opts = {"kernelsmith.db": db, **INDUCTOR, **kw.pop("options", {})}
    return torch.compile(model, backend="kernelsmith", options=opts, **kw)


def _last_hits():
    return B.compile_reports()[-1].hits


@pytest.mark.parametrize("name", ["mlp", "conv", "block"])
def test_outputs_match_eager_and_hits_happen(warmed, name):
    db, models, _ = warmed
    model, input_sets = models[name]
    compiled = _compile(model, db)
    B.clear_reports()
    with torch.no_grad():
        got = compiled(*input_sets[0])
        want = model(*input_sets[0])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    report = B.compile_reports()[-1]
    assert report.hits >= 1 and report.swapped == report.hits, report.to_json()
    assert report.variant == "custom_op"


@pytest.mark.parametrize("name", ["mlp", "block"])
def test_training_gradients_match_eager(warmed, name):
    db, models, _ = warmed
    model, input_sets = models[name]
    model = model.train()
    try:
        compiled = _compile(model, db)
        x = input_sets[0][0].clone().requires_grad_(True)
        compiled(x).square().sum().backward()
        assert _last_hits() >= 1
        got = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        x.grad = None
        model(x).square().sum().backward()
        want = [x.grad] + [p.grad for p in model.parameters()]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    finally:
        model.zero_grad()
        model.eval()


def test_changing_batch_sizes(warmed):
    """Batch 4 compiles static; batch 6 recompiles dynamic and, warmed for 6, specialises to its kernel;
    batch 5 was never warmed: a third graph that Inductor compiles alone. All match eager."""
    db, models, _ = warmed
    model, _ = models["mlp"]
    compiled = _compile(model, db)
    reports = []
    with torch.no_grad():
        for batch in (4, 6, 5, 4):
            x = torch.randn(batch, 16)
            n = len(B.compile_reports())
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            reports.append(B.compile_reports()[n:])
    assert reports[0][0].hits >= 1
    assert reports[1] and reports[1][0].hits >= 1 and all(r.symbolic for r in reports[1][0].regions if r.index >= 0)
    assert reports[2] and reports[2][0].hits == 0
    assert not reports[3], "batch 4 must reuse its first compile"


def test_mode_is_honoured_for_inductor():
    assert B._inductor_patches("max-autotune", {"compile_threads": 1}) == {
        "max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True, "compile_threads": 1}
    assert B._inductor_patches(None, {}) == {}


def test_warm_is_resumable(warmed):
    """Warming the same regions again judges nothing: every key with a kernel is skipped."""
    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import warm

    db, models, summary = warmed
    found = [i for i in summary.items if i.status in ("found", "skipped")]
    store = KernelStore(db)
    try:
        problems = [store.get_problem(i.key) for i in found]
        again = warm(problems, store, EvolveConfig(budget=2, backend="triton-interpret"))
    finally:
        store.close()
    assert [i.status for i in again.items] == ["skipped"] * len(found)
    assert sum(i.judged for i in again.items) == 0


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU kernels need the interpreter")
def test_explain_shows_hits_and_misses(warmed):
    from ks_inductor.compiler.explain import explain

    db, models, _ = warmed
    model, input_sets = models["conv"]
    result = explain(model, *input_sets[0], db=db)
    statuses = {r.kind: r.status for r in result.regions if r.index >= 0}
    assert "hit" in statuses.values()
    assert result.hits >= 1
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(result.table())
    text = console.export_text()
    assert "hit" in text and result.regions[0].key[:16] in text
