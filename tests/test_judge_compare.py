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


def test_the_float64_result_is_read_only_where_the_fast_pass_needs_it() -> None:
    """A GB-scale rerun is read from disk for every comparison otherwise: given as a loader, it is called only for
    an output the fast pass does not pass, and then once."""
    eager, fused, truth = _rope_like(1 << 15, 0)
    calls = []

    def load() -> list[torch.Tensor]:
        calls.append(1)
        return [truth]

    assert C.compare_outputs([eager], [eager.clone()], tol, 0, "t", truth=load)[1] is None
    assert calls == []
    assert C.compare_outputs([eager, eager], [fused, fused], tol, 0, "t", truth=lambda: load() * 2)[1] is None
    assert calls == [1]


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


def fp32_tol(_dtype: str) -> tuple[float, float]:
    return (1e-4, 1e-4)


def fast_and_exact(r: torch.Tensor, o: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> tuple[bool, bool]:
    return C._fast_pass(r, o, atol, rtol), C._exact(r, o, atol, rtol, 0, 0, "t")[1] is None


@pytest.mark.parametrize("dtype,size", [(torch.float32, 1e30), (torch.bfloat16, 1e30), (torch.float64, 1e200)])
def test_huge_outputs_cannot_hide_zeros_in_an_overflowed_norm(dtype: torch.dtype, size: float) -> None:
    """Squares of 1e30 overflow fp32 and of 1e200 float64: an answer with 90% of its elements zero is rejected
    element by element, with a finite relative L2 error, by eager's bound and by the float64 result's (bf16)."""
    g = torch.Generator().manual_seed(1)
    exact = torch.randn(100_000, generator=g, dtype=torch.float64) * size
    r = exact.to(dtype)
    truth = [exact.float()] if dtype == torch.bfloat16 else None
    zeros = torch.zeros_like(r)
    zeros[:10_000] = r[:10_000]
    m, why = C.compare_outputs([r], [zeros], tol, 0, "large", truth=truth)
    assert why is not None and "elements outside tolerance" in why, why
    assert m.fraction_mismatched > 0.89 and m.rel_l2_error == pytest.approx(0.9 ** 0.5, rel=0.02), m
    assert fast_and_exact(r, zeros, 1e-2, 1e-2) == (False, False)
    close = (exact * (1 + 1e-3 * torch.randn(100_000, generator=g, dtype=torch.float64))).to(dtype)
    assert C.compare_outputs([r], [close], tol, 0, "large", truth=truth)[1] is None
    assert fast_and_exact(r, close, 1e-2, 1e-2) == (True, True)


def test_tiny_outputs_cannot_hide_zeros_in_an_underflowed_norm() -> None:
    """Squares of 1e-25 underflow fp32 to 0: the relative L2 error of an all-zero answer is still 1."""
    r = torch.randn(100_000, generator=torch.Generator().manual_seed(2)) * 1e-25
    m, why = C.compare_outputs([r], [torch.zeros_like(r)], fp32_tol, 0, "t")
    assert why is not None and "relative L2" in why and m.rel_l2_error == pytest.approx(1.0)
    assert fast_and_exact(r, torch.zeros_like(r)) == (False, False)
    assert fast_and_exact(r, r * (1 + 1e-6)) == (True, True)


@pytest.mark.parametrize("tolerance", [fp32_tol, tol])
def test_one_huge_element_does_not_loosen_the_others(tolerance) -> None:
    """One element of 1e6 among values of order 1 lifts the RMS to 1e4: a bound scaled by it lets an answer 0.5 off
    everywhere else pass. The bound of the ordinary elements is set by them."""
    r = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    r[7] = 1e6
    off = r + 0.5
    off[7] = r[7]
    m, why = C.compare_outputs([r], [off], tolerance, 0, "t")
    assert why is not None and m.fraction_mismatched > 0.99 and m.first_bad_index == [0], why
    atol = tolerance("float32")[0]
    assert m.atol < 2 * atol, m
    assert fast_and_exact(r, off, *tolerance("float32")) == (False, False)
    one = r.clone()
    one[100] += 0.5  # a single wrong ordinary element
    assert C.compare_outputs([r], [one], tolerance, 0, "t")[1] is not None
    assert C.compare_outputs([r], [r * (1 + 1e-5)], tolerance, 0, "t")[1] is None


def test_a_few_overflowing_elements_cannot_hide_zeros_elsewhere() -> None:
    """0.1% of the elements at 1e25 (their squares overflow fp32, the norm of the reference is inf) and the rest at
    1e15, written as zeros: the L2 error is 1e-8 of the norm, so the elementwise bound alone can catch it."""
    g = torch.Generator().manual_seed(4)
    r = torch.randn(100_000, generator=g) * 1e15
    r[:100] = torch.randn(100, generator=g) * 1e25
    zeros = torch.zeros_like(r)
    zeros[:100] = r[:100]
    m, why = C.compare_outputs([r], [zeros], fp32_tol, 0, "t")
    assert why is not None and "elements outside tolerance" in why and m.fraction_mismatched > 0.99, why
    assert m.rel_l2_error < 1e-4
    assert fast_and_exact(r, zeros) == (False, False)


def _blocked_matmul(a: torch.Tensor, b: torch.Tensor, block: int = 64) -> torch.Tensor:
    """a @ b summed over K in blocks: another order of the same fp32 sums, as a tiled kernel computes it."""
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(0, a.shape[1], block):
        acc += a[:, k:k + block] @ b[k:k + block]
    return acc


@pytest.mark.parametrize("outlier_row", [1.0, 1000.0])
def test_a_gemm_summed_in_another_order_passes_at_the_scale_of_its_terms(outlier_row: float) -> None:
    """A GEMM of 100x inputs (outputs of order 6e5): elements near 0 differ from torch's by up to about 1, far over
    atol, and are correct. Also with one row of 1000x outliers, and after a relu zeroes half the elements."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(128, 4096, generator=g) * 100
    b = torch.randn(4096, 128, generator=g) * 100
    a[3] *= outlier_row
    ref, out = a @ b, _blocked_matmul(a, b)
    assert bool(((out - ref).abs() > 1e-4 + 1e-4 * ref.abs()).any())  # the unscaled bound would turn it away
    assert C.compare_outputs([ref], [out], fp32_tol, 3, "large")[1] is None
    assert fast_and_exact(ref, out) == (True, True)
    assert C.compare_outputs([ref.relu()], [out.relu()], fp32_tol, 3, "large")[1] is None
    wrong = out.clone()
    wrong[5, 5] += 1e3  # a thousandth of the output's scale
    assert C.compare_outputs([ref], [wrong], fp32_tol, 3, "large")[1] is not None


def test_the_scale_is_estimated_from_a_fixed_sample() -> None:
    g = torch.Generator().manual_seed(6)
    r = torch.randn(1000, 1000, generator=g) * 1e4
    r.view(-1)[::10_000] = 1e12  # 100 outliers, outside the sample's quantile
    s = C._output_scale(r)
    assert s == C._output_scale(r.clone()) and s == pytest.approx(1e4, rel=0.05)
    assert C._output_scale(r.t()) == pytest.approx(s, rel=0.05)  # strided: indexed in place, not copied
    assert C._output_scale(torch.zeros(10)) == 1.0 and C._output_scale(torch.full((10,), 0.5)) == 1.0
    # A sparse output: the RMS caps what the few nonzero values would give.
    sparse = torch.zeros(10_000)
    sparse[:100] = 1e4
    assert C._output_scale(sparse) == pytest.approx(1e3)


def test_signed_zeros_special_values_and_integers_are_compared_exactly() -> None:
    inf, nan = float("inf"), float("nan")
    r = torch.tensor([0.0, -0.0, 1e30, inf, -inf, nan, 3e38, -1.0] * 100)
    assert verdict(r, torch.tensor([-0.0, 0.0, 1e30, inf, -inf, nan, 3e38, -1.0] * 100))  # zero's sign is free
    for k, v in [(3, -inf), (4, nan), (5, 0.0), (6, -3e38), (7, inf)]:
        o = r.clone()
        o[k] = v  # 3e38 against -3e38 differs past fp32's range
        assert not verdict(r, o), (k, v)
        assert C._fast_pass(r, o, 1e-2, 1e-2) is False
    m, _ = C.compare_outputs([r], [torch.where(torch.isnan(r), 0.0, r)], tol, 0, "nan")
    assert m.nan_dropped == 100 and m.nan_added == 0
    mask = torch.rand(1000, generator=torch.Generator().manual_seed(7)) > 0.5
    flipped = mask.clone()
    flipped[9] = ~flipped[9]
    assert verdict(mask, mask.clone()) and not verdict(mask, flipped)
    big = torch.tensor([2 ** 62, 5], dtype=torch.int64)
    assert not verdict(big, big + torch.tensor([1, 0]))  # float64 cannot tell these apart; integers are exact
