"""Comparing a candidate's outputs with the reference's, in the judge's own process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ks_inductor.judge.verdict import Mismatch

# Elements per chunk of the fast pass: large enough to amortise op dispatch, small enough that the fp32
# temporaries stay in cache and a 500 MB output does not need gigabytes of float64 scratch.
_CHUNK = 1 << 21


def compare_outputs(
    ref: list[Any], out: list[Any], tolerance: Callable[[str], tuple[float, float]], trial: int, dist: str,
    truth: list[Any] | None = None,
) -> tuple[Mismatch | None, str | None]:
    """Return (mismatch statistics, reason) for the first output that fails, or (None, None) when all pass.

    An element passes when |out - ref| <= atol * scale + rtol * |ref|, scale being the output's RMS where that is
    above 1; the whole output must also keep its relative L2 error under rtol, so an all-zero answer cannot hide
    under atol when the true values are tiny. NaN in the output never passes.

    The scale is there for sums that cancel: an element of a product whose terms are of size S carries rounding
    errors of order eps * S whatever its own value, and a correct fp32 kernel summing in another order than the
    reference differed by 0.05 on an element near 0 of a 100x-magnitude trial whose outputs were of order 1e4.

    ``truth``, where given, holds the reference's outputs recomputed in float64 (``worker._truth``): a float16 or
    bfloat16 output that fails the bound above still passes where every element is no further from the float64
    result than eager's own element, plus the same bound (``_closer_than_eager``). Eager rounds after every op; a
    kernel that keeps fp32 intermediates (Inductor's, for one) rounds once and is the more accurate of the two.
    """
    import torch

    if len(ref) != len(out):
        return None, f"trial {trial}: the candidate returned {len(out)} outputs, the reference {len(ref)}"
    for i, (r, o) in enumerate(zip(ref, out)):
        if tuple(o.shape) != tuple(r.shape):
            return None, f"trial {trial}: output {i} has shape {list(o.shape)}, expected {list(r.shape)}"
        if o.dtype != r.dtype:
            return None, f"trial {trial}: output {i} has dtype {o.dtype}, expected {r.dtype}"
        if r.numel() == 0:
            continue
        dtype = str(r.dtype).replace("torch.", "")
        atol, rtol = tolerance(dtype)
        # The fast pass decides almost every comparison; the exact float64 pass below only runs to describe a
        # failure (or when the fast pass cannot decide), so both always agree on the verdict.
        if r.is_floating_point() and _fast_pass(r, o, atol, rtol):
            continue
        t = truth[i] if truth is not None and i < len(truth) else None
        if (t is not None and r.dtype in (torch.float16, torch.bfloat16) and tuple(t.shape) == tuple(r.shape)
                and _closer_than_eager(r, o, t, atol, rtol)):
            continue
        if not r.is_floating_point() and not r.is_complex() and torch.equal(o, r):
            continue  # integers and booleans (indices, masks) must be equal, and are
        m, why = _exact(r, o, atol, rtol, trial, i, dist)
        if why:
            return m, why
    return None, None


def _scaled_atol(atol: float, sum_sq: float, n: int) -> float:
    """atol times the output's RMS (``sum_sq`` over its ``n`` finite values) where that is above 1."""
    return atol * max(1.0, (sum_sq / max(n, 1)) ** 0.5)


def _fast_pass(r: Any, o: Any, atol: float, rtol: float) -> bool:
    """True when every element is within tolerance and the relative L2 error is under rtol, computed chunk by
    chunk in fp32 (fp64 for fp64 outputs), by the exact pass's rules: NaN and inf must match position for position
    (NaN for NaN, inf of the same sign) and the rest is held to the bound. False means "not shown to pass": the
    exact pass decides. The NaN-input trial of every judgment comes here with NaN in the reference, so NaN is
    handled here rather than sent to the float64 pass over the whole output."""
    import torch

    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rf, of = r.reshape(-1), o.reshape(-1)
    num = den = scale_sq = 0.0
    finite_ref = 0
    excess = -float("inf")  # the largest |out - ref| - rtol * |ref|, held against the scaled atol at the end
    for s in range(0, rf.numel(), _CHUNK):
        a = rf[s:s + _CHUNK].to(work)
        b = of[s:s + _CHUNK].to(work)
        d = b - a
        e = float(d.abs().sub_(a.abs().mul_(rtol)).max())
        if e != e or e == float("inf"):
            # NaN or inf on either side (a finite excess means both sides are finite): positions must match.
            fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
            nan_a, nan_b = torch.isnan(a), torch.isnan(b)
            if bool((~(fin_a & fin_b) & ((nan_a != nan_b) | (~nan_a & (a != b)))).any()):
                return False
            scale_sq += float(torch.linalg.vector_norm(torch.where(fin_a, a, 0.0))) ** 2
            finite_ref += int(fin_a.sum())
            # Zero where either side is not finite: those positions matched above, and a zero adds nothing to
            # the norms and 0 to the excess, which the (non-negative) scaled atol always admits.
            both = fin_a & fin_b
            a, d = torch.where(both, a, 0.0), torch.where(both, d, 0.0)
            e = float(d.abs().sub_(a.abs().mul_(rtol)).max())
            a_sq = float(torch.linalg.vector_norm(a)) ** 2
        else:
            a_sq = float(torch.linalg.vector_norm(a)) ** 2
            scale_sq, finite_ref = scale_sq + a_sq, finite_ref + a.numel()
        excess = max(excess, e)
        num += float(torch.linalg.vector_norm(d)) ** 2
        den += a_sq
    if not excess <= _scaled_atol(atol, scale_sq, finite_ref):
        return False
    rel_l2 = (num ** 0.5) / (den ** 0.5) if den > 0 else num ** 0.5
    # Within a hair of the bound the fp32 sums could disagree with float64: let the exact pass decide.
    return rel_l2 <= rtol * 0.999


def _closer_than_eager(r: Any, o: Any, t: Any, atol: float, rtol: float) -> bool:
    """True when every element of ``o`` is within eager's own distance from the float64 result ``t``, plus ``atol``
    (scaled as for eager's bound) and ``rtol`` of the result, and the output's L2 distance from ``t`` is within
    eager's plus ``rtol`` of ``t``'s norm. Any NaN or inf on any side leaves the decision to the bound on eager
    alone."""
    import torch

    rf, of, tf = r.reshape(-1), o.reshape(-1), t.reshape(-1)
    excess = -float("inf")
    scale_sq = eager_sq = out_sq = truth_sq = 0.0
    for s in range(0, rf.numel(), _CHUNK):
        a = rf[s:s + _CHUNK].to(torch.float32)
        b = of[s:s + _CHUNK].to(torch.float32)
        c = tf[s:s + _CHUNK].to(torch.float32)
        if not bool(torch.isfinite(a).all() and torch.isfinite(b).all() and torch.isfinite(c).all()):
            return False
        own = (a - c).abs()
        excess = max(excess, float(((b - c).abs() - own - c.abs() * rtol).max()))
        scale_sq += float(torch.linalg.vector_norm(a)) ** 2
        eager_sq += float(torch.linalg.vector_norm(own)) ** 2
        out_sq += float(torch.linalg.vector_norm(b - c)) ** 2
        truth_sq += float(torch.linalg.vector_norm(c)) ** 2
    if not excess <= _scaled_atol(atol, scale_sq, rf.numel()):
        return False
    return out_sq ** 0.5 <= eager_sq ** 0.5 + rtol * truth_sq ** 0.5


def _exact(r: Any, o: Any, atol: float, rtol: float, trial: int, i: int,
           dist: str) -> tuple[Mismatch | None, str | None]:
    import torch

    nan_dropped = nan_added = 0
    if not r.is_floating_point():
        bad = o != r
        rel_l2 = float(bad.float().mean())
        diff = (o.to(torch.float64) - r.to(torch.float64)).abs()
    else:
        r64, o64 = r.to(torch.float64), o.to(torch.float64)
        diff = (o64 - r64).abs()
        ref_finite = torch.isfinite(r64)
        atol = _scaled_atol(atol, float(torch.linalg.vector_norm(torch.where(ref_finite, r64, 0.0))) ** 2,
                            int(ref_finite.sum()))
        bound = atol + rtol * r64.abs()
        # Where either side is NaN or inf the other must be the same (NaN for NaN, inf of the same sign).
        ref_nan, out_nan = torch.isnan(r64), torch.isnan(o64)
        special = ref_nan | out_nan | torch.isinf(r64) | torch.isinf(o64)
        bad = torch.where(special, (ref_nan != out_nan) | (~ref_nan & (o64 != r64)), diff > bound)
        nan_dropped, nan_added = int((ref_nan & ~out_nan).sum()), int((out_nan & ~ref_nan).sum())
        finite = torch.isfinite(r64) & torch.isfinite(o64)
        num = float(torch.linalg.vector_norm(torch.where(finite, o64 - r64, 0.0)))
        den = float(torch.linalg.vector_norm(torch.where(finite, r64, 0.0)))
        rel_l2 = num / den if den > 0 else num
    n_bad = int(bad.sum())
    if not n_bad and rel_l2 <= rtol:
        return None, None
    diff_f = torch.nan_to_num(diff, nan=float("inf"))
    rel = diff_f / r.to(torch.float64).abs().clamp_min(1e-12)
    first = None
    if n_bad:
        flat = int(torch.nonzero(bad.reshape(-1))[0])
        first = [int(x) for x in torch.unravel_index(torch.tensor(flat), tuple(r.shape))]
    m = Mismatch(
        trial=trial, output_index=i, max_abs_error=float(diff_f.max()), max_rel_error=float(rel.max()),
        fraction_mismatched=n_bad / r.numel(), first_bad_index=first, rel_l2_error=rel_l2,
        distribution=dist, atol=atol, rtol=rtol, nan_dropped=nan_dropped, nan_added=nan_added,
    )
    why = (f"{n_bad} of {r.numel()} elements outside tolerance" if n_bad
           else f"relative L2 error {rel_l2:.3g} above {rtol:g}")
    return m, f"trial {trial} ({dist} inputs): output {i} is wrong: {why}"
