"""The judge's output comparison: the chunked fast pass must reach the same verdict as the exact float64 rule."""

import pytest
import torch

from ks_inductor.judge import compare as C


def tol(_dtype: str) -> tuple[float, float]:
    return (1e-2, 1e-2)


def verdict(r: torch.Tensor, o: torch.Tensor) -> bool:
    return C.compare_outputs([r], [o], tol, 0, "t")[1] is None


def exact(r: torch.Tensor, o: torch.Tensor) -> bool:
    return C._exact(r, o, 1e-2, 1e-2, 0, 0, "t")[1] is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_fast_pass_agrees_with_exact_rule(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "_CHUNK", 1000)  # several chunks, and a ragged last one
    g = torch.Generator().manual_seed(0)
    r = torch.randn(5003, generator=g).to(dtype)
    cases = {
        "same": r.clone(),
        "tiny noise": (r.double() * (1 + 1e-3 * torch.randn(5003, generator=g, dtype=torch.float64))).to(dtype),
        "one far": r.clone().index_fill_(0, torch.tensor([4999]), 50.0),
        "nan": r.clone().index_fill_(0, torch.tensor([17]), float("nan")),
        "inf": r.clone().index_fill_(0, torch.tensor([1200]), float("inf")),
        "zeros": torch.zeros_like(r),
    }
    for name, o in cases.items():
        assert verdict(r, o) == exact(r, o), name
    assert verdict(r, cases["same"]) and verdict(r, cases["tiny noise"])
    assert not verdict(r, cases["one far"]) and not verdict(r, cases["nan"]) and not verdict(r, cases["inf"])


def test_special_values_follow_the_exact_rule() -> None:
    r = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    assert verdict(r, r.clone())  # inf equals inf, NaN where the reference has NaN
    assert not verdict(r, torch.tensor([1.0, -float("inf"), float("nan"), -2.0]))
    assert not verdict(r, torch.tensor([1.0, float("inf"), float("nan"), float("nan")]))
    # A finite answer where the reference is inf or NaN is wrong too.
    assert not verdict(r, torch.tensor([1.0, 0.0, float("nan"), -2.0]))
    assert not verdict(r, torch.tensor([1.0, float("inf"), 3.0, -2.0]))


def test_tiny_outputs_cannot_hide_under_atol() -> None:
    r = torch.randn(10_000) * 1e-4
    why = C.compare_outputs([r], [torch.zeros_like(r)], tol, 3, "normal")[1]
    assert why is not None and "relative L2" in why and "trial 3" in why


def test_shape_dtype_and_integer_outputs() -> None:
    r = torch.arange(12).reshape(3, 4)
    assert verdict(r, r.clone())
    assert not verdict(r, r + 1)
    assert "shape" in C.compare_outputs([r], [r.reshape(4, 3)], tol, 0, "t")[1]
    assert "dtype" in C.compare_outputs([r.float()], [r.double()], tol, 0, "t")[1]
    m, why = C.compare_outputs([r.float()], [r.float().index_fill_(1, torch.tensor([2]), 99.0)], tol, 0, "t")
    assert why and m.first_bad_index == [0, 2] and m.fraction_mismatched == 3 / 12


def test_a_cancelling_element_is_judged_at_the_output_scale() -> None:
    """A product of 100x inputs: outputs of order 1e4, one of them cancelling to near 0. Another summation
    order moves that element by about eps times the terms, far above atol, and that is still a correct answer;
    an error of a thousandth of the output's scale is not."""
    def fp32(_dtype: str) -> tuple[float, float]:
        return (1e-4, 1e-4)

    g = torch.Generator().manual_seed(0)
    r = torch.randn(1024, generator=g) * 1e4
    r[5] = 0.01
    reordered = r.clone()
    reordered[5] += 0.05
    assert C.compare_outputs([r], [reordered], fp32, 3, "large")[1] is None
    wrong = r.clone()
    wrong[5] += 10.0
    assert "1 of 1024 elements" in C.compare_outputs([r], [wrong], fp32, 3, "large")[1]
    # At unit scale the bound is atol itself.
    small = torch.randn(1024, generator=g) * 0.5
    nudged = small.clone()
    nudged[5] += 5e-4 + 1e-4 * abs(float(small[5]))  # under rtol in relative L2, so the element bound decides
    assert C.compare_outputs([small], [nudged], fp32, 0, "normal")[1] is not None


def test_fast_pass_never_accepts_what_the_exact_pass_rejects_with_nan_and_inf():
    """The fast pass decides outputs with NaN and inf too (the NaN-input trial of every judgment); wherever it says
    "pass" the float64 pass agrees, and it says "pass" for a correct output with NaN and inf in it."""
    import random

    import torch

    from ks_inductor.judge.compare import _exact, _fast_pass

    rng = random.Random(0)
    passed = 0
    for case in range(300):
        n = rng.choice([7, 1000, (1 << 21) + 5])
        r = torch.randn(n, generator=torch.Generator().manual_seed(case)) * rng.choice([1e-3, 1.0, 1e3])
        o = r.clone()
        for _ in range(rng.randrange(4)):
            i = rng.randrange(n)
            r[i] = o[i] = rng.choice([float("nan"), float("inf"), -float("inf")])
        kind = rng.randrange(6)
        j = rng.randrange(n)
        if kind == 1:
            o[j] = float("nan")  # a NaN the reference does not have
        elif kind == 2:
            o[j] = -r[j] if torch.isinf(r[j]) else float("inf")
        elif kind == 3:
            o += 1e-4 * torch.randn(n)
        elif kind == 4:
            o[j] += 1.0
        elif kind == 5 and torch.isnan(r[j]):
            o[j] = 0.0  # a NaN dropped
        fast = _fast_pass(r, o, 1e-5, 1e-5)
        m, why = _exact(r, o, 1e-5, 1e-5, 0, 0, "nan")
        if fast:
            passed += 1
            assert why is None, (case, kind, why)
        if kind == 0:
            assert fast, case  # a correct output with NaN and inf decides in the fast pass
    assert passed > 50



def _rope_like(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q*c + r*s in bfloat16: eager's (rounding after each op), a fused kernel's (fp32, one rounding) and the
    float64 result. Element 0's products cancel: eager is off by 0.029 there, two units in its last place."""
    g = torch.Generator().manual_seed(seed)
    q, r, c, s = (torch.randn(n, generator=g).to(torch.bfloat16) for _ in range(4))
    for t, v in zip((q, c, r, s), (-1.6875, -2.453125, -0.76171875, 5.4375)):
        t[0] = v
    eager = q * c + r * s
    fused = (q.float() * c.float() + r.float() * s.float()).to(torch.bfloat16)
    truth = q.double() * c.double() + r.double() * s.double()
    return eager, fused, truth.float()


def test_a_fused_low_precision_kernel_closer_to_float64_than_eager_passes() -> None:
    eager, fused, truth = _rope_like(1 << 15, 0)
    assert abs(float(eager[0]) - float(truth[0])) > 0.025 and abs(float(fused[0]) - float(truth[0])) < 1e-3
    # The bound on eager alone turns the more accurate kernel away ...
    assert C.compare_outputs([eager], [fused], tol, 0, "t")[1] is not None
    # ... where it is no further from the float64 result than eager's own rounding, it passes.
    assert C.compare_outputs([eager], [fused], tol, 0, "t", truth=[truth])[1] is None


def test_the_float64_result_relaxes_nothing_for_a_wrong_element_or_another_dtype() -> None:
    eager, fused, truth = _rope_like(1 << 15, 0)
    wrong = fused.clone()
    wrong[1] += 0.25  # an element eager got right
    assert C.compare_outputs([eager], [wrong], tol, 0, "t", truth=[truth])[1] is not None
    nan = fused.clone()
    nan[1] = float("nan")
    assert C.compare_outputs([eager], [nan], tol, 0, "t", truth=[truth])[1] is not None
    # fp32 outputs are held to eager's alone, whatever the float64 result says.
    e32 = eager.float()
    assert C.compare_outputs([e32], [truth + 0.05], tol, 0, "t", truth=[truth])[1] is not None
