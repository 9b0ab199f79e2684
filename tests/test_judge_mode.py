"""The judge runs a problem's Model in the mode it was traced in (training, as KernelBench's harness does), and
refuses a reference that is not a function of its inputs."""

from __future__ import annotations

from ks_inductor.catalogue.sources import module
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, templates_for

# The traced graph holds the training branch (x * 2); an eval-mode reference would return x * 3.
MODE_BRANCH = module("        return xs[0] * (2.0 if self.training else 3.0)", "[torch.randn(4, 40)]")
DROPOUT = module("        return torch.softmax(self.drop(xs[0]), dim=1)", "[torch.randn(4, 40)]",
                 init="        self.drop = nn.Dropout(0.5)")
NO_DROPOUT = module("        return torch.softmax(self.drop(xs[0]), dim=1)", "[torch.randn(4, 40)]",
                    init="        self.drop = nn.Dropout(0.0)")


def _seed(problem) -> str:
    fm = classify(problem)
    assert fm is not None
    fm.target = "cpu"
    t = templates_for(fm)[0]
    v = t.variants(fm)[0]
    return t.render(fm, t.default(fm, v, "cpu"), v)


def test_the_seed_traced_in_training_mode_is_judged_in_training_mode(judge) -> None:
    problem = problem_from_source(MODE_BRANCH, name="mode_branch")
    assert float.hex(2.0) in problem.graph_text and float.hex(3.0) not in problem.graph_text
    r = judge.evaluate(problem, _seed(problem))
    assert r.accepted, (r.verdict, r.reasons[:2], r.error)


def test_a_reference_with_live_dropout_is_refused_with_a_reason(judge) -> None:
    problem = problem_from_source(DROPOUT, name="live_dropout")
    candidate = _seed(problem_from_source(NO_DROPOUT, name="no_dropout"))
    r = judge.evaluate(problem, candidate)
    assert not r.accepted and r.verdict == "error"
    assert "not a function of its inputs" in r.error and "dropout" in r.error
    # The same kernel against the problem with p=0 passes: the refusal is the reference's, not the kernel's.
    r = judge.evaluate(problem_from_source(NO_DROPOUT, name="no_dropout"), candidate)
    assert r.accepted, (r.verdict, r.reasons[:2], r.error)
