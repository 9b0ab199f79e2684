"""Regions of Dynamo graphs: kinds, convexity, that a region's callable computes what the graph did, and that a
region's key equals the key of the same computation given as a KernelBench file."""

import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ks_inductor.catalogue.models import CachedAttention
from ks_inductor.compiler import regions as rg
from ks_inductor.problem_tracing import load_problem

H = 32


class RMS(nn.Module):
    def __init__(self, dim=H):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w


class Decoder(nn.Module):
    """A small Llama-style layer (same structure as shared/anchors/measure_layer.py)."""

    NH, KV, D, FF = 4, 2, 8, 64

    def __init__(self):
        super().__init__()
        NH, KV, D, FF = self.NH, self.KV, self.D, self.FF
        self.n1, self.n2 = RMS(), RMS()
        self.q = nn.Linear(H, NH * D, bias=False)
        self.k = nn.Linear(H, KV * D, bias=False)
        self.v = nn.Linear(H, KV * D, bias=False)
        self.o = nn.Linear(NH * D, H, bias=False)
        self.g = nn.Linear(H, FF, bias=False)
        self.u = nn.Linear(H, FF, bias=False)
        self.d = nn.Linear(FF, H, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        NH, KV, D = self.NH, self.KV, self.D

        def rot(t):
            return torch.cat((-t[..., D // 2:], t[..., : D // 2]), -1)

        h = self.n1(x)
        q = self.q(h).view(B, T, NH, D).transpose(1, 2)
        k = self.k(h).view(B, T, KV, D).transpose(1, 2)
        v = self.v(h).view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, NH * D))
        h = self.n2(x)
        return x + self.d(F.silu(self.g(h)) * self.u(h))


def _capture(model, *inputs, with_inputs=False):
    graphs = []

    def backend(gm, example_inputs, **_):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*inputs)
    assert len(graphs) == 1
    return graphs[0] if with_inputs else graphs[0][0]


def _decoder_inputs(B=2, T=4):
    D = Decoder.D
    return torch.randn(B, T, H), torch.randn(1, 1, T, D), torch.randn(1, 1, T, D)


def _check_convex_and_disjoint(gm, regions):
    seen = set()
    for r in regions:
        members = set(r.nodes)
        assert not (members & seen), "regions overlap"
        seen |= members
        # no path leaves the region and comes back
        outside_users = [u for n in r.nodes for u in n.users if u not in members]
        stack, visited = list(outside_users), set()
        while stack:
            n = stack.pop()
            assert n not in members, f"region {r.index} is not convex"
            if n in visited:
                continue
            visited.add(n)
            stack.extend(n.users)


def test_decoder_layer_regions_cover_norms_anchors_and_epilogues():
    torch.manual_seed(0)
    m = Decoder().eval()
    gm = _capture(m, *_decoder_inputs())
    part = rg.partition(gm)
    kinds = [r.kind for r in part.regions]
    assert kinds.count("norm") == 2
    assert "attention" in kinds
    assert kinds.count("matmul") >= 5
    _check_convex_and_disjoint(gm, part.regions)
    # the second norm takes the residual add in front of it and hands both results on
    second_norm = [r for r in part.regions if r.kind == "norm"][1]
    assert second_norm.ops[0] == "add" and len(second_norm.outputs) == 2
    # the gate projection carries the SiLU * up epilogue
    assert any(r.kind == "matmul" and "sigmoid" in r.ops and r.ops.count("mul") >= 2 for r in part.regions)


def test_region_module_reproduces_the_graph():
    torch.manual_seed(0)
    m = Decoder().eval()
    inputs = _decoder_inputs()
    gm, example_inputs = _capture(m, *inputs, with_inputs=True)
    part = rg.partition(gm)
    # Run the graph with an interpreter that records every node's value, then each region alone on the values
    # of its inputs: the outputs must agree exactly.
    values = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        Rec(gm).run(*example_inputs)
        for r in part.regions:
            mod = rg.region_module(gm, r)
            outs = mod(*[values[a] for a in r.inputs])
            for o, got in zip(r.outputs, outs):
                torch.testing.assert_close(got, values[o], rtol=0, atol=0)


def test_region_key_equals_kernelbench_file_key(tmp_path):
    """The key the backend computes for an RMSNorm region is the key of the same computation as a problem file."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMS()
            self.lin = nn.Linear(H, H)

        def forward(self, x):
            return self.lin(self.norm(x))

    gm = _capture(Net(), torch.randn(8, H))
    part = rg.partition(gm)
    norm = [r for r in part.regions if r.kind == "norm"][0]
    region_key = rg.region_problem(gm, norm).key
    f = tmp_path / "rmsnorm_region.py"
    f.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x, w):
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

        def get_inputs():
            return [torch.randn(8, 32), torch.randn(32)]

        def get_init_inputs():
            return []
    """))
    assert load_problem(f).key == region_key
    # a different epsilon is a different problem
    f.write_text(f.read_text().replace("1e-6", "1e-5"))
    assert load_problem(f).key != region_key


def test_lone_pointwise_op_and_chains_are_regions():
    """A lone pointwise op is a region of its own (Inductor's kernel seeds it); a chain is one region."""
    class P(nn.Module):
        def forward(self, x, y):
            a = torch.relu(x)  # alone
            b = torch.sigmoid(y) * y + 1.0  # a chain
            return a, b

    gm = _capture(P(), torch.randn(4, 8), torch.randn(4, 8))
    part = rg.partition(gm)
    assert [r.kind for r in part.regions] == ["pointwise", "pointwise"]
    assert [r.ops for r in part.regions] == [["relu"], ["sigmoid", "mul", "add"]]


def test_pools_scans_and_chunks_make_regions():
    """Ops Inductor writes as Triton kernels without aten tagging them reductions (a pool, a scan) are regions, and
    a chunk joins the pointwise work it feeds as a view."""
    class Q(nn.Module):
        def forward(self, x):
            gate, up = x.chunk(2, dim=-1)
            return torch.cumsum(F.max_pool1d(torch.relu(gate) * up, 3, 2), -1)

    gm = _capture(Q(), torch.randn(2, 4, 32))
    part = rg.partition(gm)
    assert part.regions and not part.unsupported
    ops = {o for r in part.regions for o in r.ops}
    assert {"relu", "mul", "cumsum"} <= ops and any(o.startswith("max_pool") for o in ops)


def test_unsupported_ops_are_reported_not_grouped():
    class U(nn.Module):
        def forward(self, x):
            return torch.sort(torch.softmax(x, -1), -1).values

    gm = _capture(U(), torch.randn(4, 8))
    part = rg.partition(gm)
    assert [r.kind for r in part.regions] == ["softmax"]
    assert any("sort" in u for u in part.unsupported)


@pytest.mark.parametrize("batch", [3, 5])
def test_symbolic_regions_build_problems_at_their_hints(batch):
    graphs = []

    def backend(gm, ex, **_):
        graphs.append(gm)
        return gm.forward

    m = RMS()
    f = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        f(torch.randn(batch, H))
    part = rg.partition(graphs[-1])
    (norm,) = part.regions
    assert norm.symbolic
    problem = rg.region_problem(graphs[-1], norm)
    assert problem.input_specs[0].shape == [batch, H]


def test_attention_takes_rope_and_the_cache_concatenation_as_its_prologue():
    """Left to the k/v projections as epilogues, the cache concatenation would have to be materialised; in the
    attention region one kernel reads the cache once. The projections stay plain GEMMs."""
    torch.manual_seed(0)
    D = 8
    inputs = (torch.randn(2, 1, H), torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D), torch.randn(2, 2, 6, D),
              torch.randn(2, 2, 6, D))
    gm = _capture(CachedAttention().eval(), *inputs)
    part = rg.partition(gm)
    _check_convex_and_disjoint(gm, part.regions)
    (att,) = [r for r in part.regions if r.kind == "attention"]
    assert att.ops.count("cat") == 4 and "sdpa" in att.ops and att.ops.count("neg") == 2
    assert sorted(r.ops for r in part.regions if r.kind == "matmul") == [["mm"], ["mm"], ["mm"]]
    assert "kernelsmith.sdpa" in rg.region_problem(gm, att).graph_text


def test_training_batch_norm_stays_with_inductor_and_says_why():
    """native_batch_norm in training mode updates its running statistics in place without declaring it in its
    schema: it makes no region (a kernel judged on its output alone could drop the update), explain says why, and
    a compile keeps eager's running statistics."""
    from ks_inductor.compiler.explain import explain

    class BN(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(16)

        def forward(self, x):
            return self.bn(x * 2.0)

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    rep = explain(BN().train(), x)
    assert all("batch_norm" not in "+".join(getattr(p, "op_summary", [])) for p in rep.problems)
    notes = [r.note for r in rep.regions if "batch_norm_updating_running_stats" in r.ops]
    assert notes and "running statistics in place" in notes[0]
    # In eval mode the same layer is a function of its inputs and makes a norm region.
    assert any(r.kind == "norm" for r in explain(BN().eval(), x).regions)

    eager, compiled_model = BN().train(), BN().train()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="kernelsmith")
    torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(compiled_model.bn.running_mean, eager.bn.running_mean)
    torch.testing.assert_close(compiled_model.bn.running_var, eager.bn.running_var)


def test_random_ops_stay_with_inductor_and_the_rest_makes_regions():
    """rand_like and dropout's bernoulli make no region (a kernel's random stream cannot be compared with the
    reference's); explain says so, the deterministic ops around them still make a region, and a compile keeps
    eager's statistics."""
    from ks_inductor.compiler.explain import explain

    class Noisy(nn.Module):
        def forward(self, x):
            return torch.relu(x) * torch.rand_like(x) + F.dropout(x, 0.5, True)

    x = torch.randn(8, 64)
    rep = explain(Noisy(), x)
    for op in ("rand_like", "bernoulli"):
        notes = [r.note for r in rep.regions if op in r.ops.split("+")]
        assert notes and "draws random numbers" in notes[0], (op, [(r.ops, r.note) for r in rep.regions])
    assert any(r.kind == "pointwise" and "relu" in r.ops for r in rep.regions)
    torch.manual_seed(0)
    out = torch.compile(Noisy(), backend="kernelsmith")(torch.ones(256, 256))
    # relu(1) * U(0, 1) + dropout(1): mean 0.5 + 1.0; a region that dropped the noise would give 1 or 3 exactly.
    assert 1.4 < out.mean().item() < 1.6 and out.std().item() > 0.2


class EmptyCacheConcat(nn.Module):
    """A key projection concatenated to an empty cache made in forward, as transformers' cache does, times a
    constant: tensors the region makes from no input, which tracing lifts as constants."""

    def __init__(self, scale: float):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        k = self.lin(x).view(2, 1, 4, 8)
        return torch.cat([torch.tensor([]).view(2, 1, 0, 8), k], -2) * torch.tensor([[self.scale] * 2]).sum()


def test_tensor_constants_a_region_makes_are_carried_into_its_problem():
    from ks_core.problem_record import exec_problem_source
    from ks_inductor.compiler.explain import explain
    from ks_inductor.problem_tracing import problem_from_callable

    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    keys = []
    for scale in (3.0, 4.0):
        m = EmptyCacheConcat(scale).eval()
        (region,) = [r for r in explain(m, x).regions if "cat" in r.ops]
        assert region.status != "unsupported", region.note
        keys.append(region.key)
    assert keys[0] != keys[1]  # the constant's value is part of what the region computes

    # The problem's own model runs, and computes the region with its constants.
    def region(h):
        return torch.cat([torch.tensor([]).view(0, 4), h], 0) * torch.tensor([[3.0, 3.0]]).sum()

    problem = problem_from_callable(region, [torch.randn(4, 8).t()], name="cache_cat")
    h = torch.randn(8, 4)
    got = exec_problem_source(problem.source, "<cache_cat>").Model()(h)
    torch.testing.assert_close(got, h * 6.0)


def test_a_constant_a_problem_cannot_carry_is_a_readable_reason():
    from ks_core.problem_record import ProblemError
    from ks_inductor.problem_tracing import problem_from_callable

    with pytest.raises(ProblemError, match=r"tensor constant of 3 differing values \(float32\[3\]\)"):
        problem_from_callable(lambda x: x + torch.tensor([1.0, 2.0, 3.0]), [torch.randn(3)], name="c")
