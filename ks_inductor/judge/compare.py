"""Comparing a candidate's outputs with the reference's, in the judge's own process."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ks_inductor.judge.verdict import Mismatch

# Elements per chunk of the fast pass: large enough to amortise op dispatch, small enough that the fp32
# temporaries stay in cache and a 500 MB output does not need gigabytes of float64 scratch.
_CHUNK = 1 << 21
# Reference elements the output scale is estimated from: enough that the 0.9 quantile's rank is known to +-0.5%,
# few enough that gathering and ranking them costs about 1% of comparing a 64M-element output on a CPU.
_SAMPLE = 1 << 14
# The 0.9 quantile of |x| for normal x is 1.645 standard deviations, so the quantile over this is the RMS on the
# outputs the scale is there for (sums of many terms) and ignores the top tenth of the magnitudes on any other.
_QUANTILE, _NORMAL_QUANTILE = 0.9, 1.6448536269514722


def compare_outputs(
    ref: list[Any], out: list[Any], tolerance: Callable[[str], tuple[float, float]], trial: int, dist: str,
    truth: list[Any] | Callable[[], list[Any]] | None = None,
) -> tuple[Mismatch | None, str | None]:
    """Return (mismatch statistics, reason) for the first output that fails, or (None, None) when all pass.

    An element passes when |out - ref| <= atol * scale + rtol * |ref|, and at most ``LOOSE_SHARE`` of the nonzero
    elements pass only through the scale (outside atol + rtol * |ref|); the whole output must also keep its relative
    L2 error under rtol, so an all-zero answer cannot hide under atol when the true values are tiny. NaN in the
    output never passes. Sums of squares are kept overflow- and underflow-free (``_SumSq``): outputs of 1e30 or of
    1e-25 square out of fp32's range, and an inf or 0 norm would let any answer through the L2 bound.

    The scale (``_output_scale``) is there for sums that cancel: an element of a product whose terms are of size S
    carries rounding errors of order eps * S whatever its own value, and a correct fp32 kernel summing in another
    order than the reference differed by 0.05 on an element near 0 of a 100x-magnitude trial whose outputs were of
    order 1e4. It is the typical magnitude of the output's elements, never one set by a few large ones.

    ``truth``, where given, holds the reference's outputs recomputed in float64 (``reference_job._truth``): a
    float16 or bfloat16 output that fails the bound above still passes where every element is no further from the
    float64 result than eager's own element, plus the same bound (``_closer_than_eager``). Eager rounds after every
    op; a kernel that keeps fp32 intermediates (Inductor's, for one) rounds once and is the more accurate of the two.

    On the NaN-input trial ``truth`` is that rerun for every floating output, made with the convolutions that
    multiply every tap (``reference_job._truth``): a NaN in the output where eager has a number passes where the
    rerun has NaN too. cuDNN and oneDNN skip the taps that fall on padding, so eager never multiplies a NaN weight by
    a padding zero; a kernel that does gets NaN there, as any plain evaluation of the model would. A NaN that no NaN
    input reaches, a number where eager has NaN, and a wrong finite value are refused as on every trial.

    ``truth`` may be given as a function that loads it: it is called only for an output the fast pass does not
    pass (a rerun of a GB-scale output is read for nothing on almost every comparison).
    """
    import torch

    loaded: dict[str, list[Any] | None] = {}

    def truth_outputs() -> list[Any] | None:
        if "t" not in loaded:
            loaded["t"] = truth() if callable(truth) else truth
        return loaded["t"]

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
        if not r.is_floating_point():
            if not r.is_complex() and torch.equal(o, r):
                continue  # integers and booleans (indices, masks) must be equal, and are
            m, why = _exact(r, o, atol, rtol, trial, i, dist)
            if why:
                return m, why
            continue
        # One scale for all three passes, so they judge every element by the same bound.
        scale = _output_scale(r)
        # The fast pass decides almost every comparison; the exact float64 pass below only runs to describe a
        # failure (or when the fast pass cannot decide), so both always agree on the verdict.
        if _fast_pass(r, o, atol, rtol, scale):
            continue
        known = truth_outputs() if truth is not None else None
        t = known[i] if known is not None and i < len(known) else None
        if t is not None and tuple(t.shape) != tuple(r.shape):
            t = None
        if (t is not None and r.dtype in (torch.float16, torch.bfloat16)
                and _closer_than_eager(r, o, t, atol, rtol, scale)):
            continue
        m, why = _exact(r, o, atol, rtol, trial, i, dist, scale, nan_reached=_nan_reached(t))
        if why:
            return m, why
    return None, None


# Elements that pass only through the output's scale (outside atol + rtol * |ref| unscaled, where ref is not 0) may
# be at most this share of an output. Honest sums that cancel leave a few such elements near 0 (0.25% of a
# 100x-magnitude fp32 product, under 1% of a bf16 one); an output of heavy-tailed magnitudes (values up to 1e26)
# moves the scale so far that a kernel writing 0 for its small majority would pass every element otherwise.
LOOSE_SHARE = 0.02


def _loose_limit(n: int) -> int:
    return int(LOOSE_SHARE * n)


def _output_scale(r: Any) -> float:
    """What the elementwise atol is multiplied by: the typical magnitude of the reference's finite elements where
    that is above 1, estimated on a fixed sample of them.

    The typical magnitude is the 0.9 quantile of the nonzero |ref| over what it is for normal values, capped by the
    RMS. On the outputs the scale exists for, sums of many terms, that is the RMS: the size of the terms that an
    element cancelling to near 0 carries the rounding errors of. The RMS alone lets a few large elements set it: one
    1e6 among values of 1 lifts the bound of every element 1e4 times, and an answer that gets only the large ones
    right passes. A quantile is moved only once a tenth of the elements are large, and then the small ones are not a
    tail but a part of the output as atypical as an element that cancels. Exact zeros stay out of the quantile: a
    mask or a relu zeroes half a product's elements or more, and says nothing of the size of its terms. The cap keeps
    the bound of a sparse output (a few values among zeros) no looser than its RMS would make it. The sample is drawn with a
    fixed seed on the output's device, so each pass gets the same scale and a large output is never sorted.
    """
    import torch

    if r.numel() > _SAMPLE:
        gen = torch.Generator(device=r.device)
        gen.manual_seed(0)
        idx = torch.randint(0, r.numel(), (_SAMPLE,), generator=gen, device=r.device)
        # Indexed in place: reshaping a strided output would copy all of it.
        vals = r.reshape(-1)[idx] if r.is_contiguous() else r[torch.unravel_index(idx, tuple(r.shape))]
    else:
        vals = r.reshape(-1)
    mag = vals.to(torch.float64).abs()
    mag = mag[torch.isfinite(mag)]
    nonzero = mag[mag > 0]
    if not nonzero.numel():
        return 1.0
    sq = _SumSq()
    sq.add(mag)
    k = max(1, math.ceil(_QUANTILE * nonzero.numel()))
    typical = float(torch.kthvalue(nonzero, k).values) / _NORMAL_QUANTILE
    return max(1.0, min(typical, sq.rms(mag.numel())))


class _SumSq:
    """A sum of squares held as ``mant * 4**exp`` (Python floats), added to one tensor at a time.

    fp32 squares overflow above 1.8e19 and underflow below 1e-19 (float64's above 1e154), and torch sums them in the
    tensor's dtype on the device: outputs of 1e30 get an inf norm and 1e-25 a zero one, and either lets the relative
    L2 bound pass an answer that is zero almost everywhere. Each tensor's norm is taken as it comes (one reduction,
    in its dtype) and taken again in float64 after an exact power-of-two rescale only where it came out inf or too
    small to be free of underflow."""

    __slots__ = ("mant", "exp")

    def __init__(self) -> None:
        self.mant, self.exp = 0.0, 0

    def add(self, x: Any, slack: float = 0.0) -> float:
        """Add the squares of ``x``, a floating tensor with finite values, and return its norm.

        Where all that underflow could have lost is under ``slack``, that much is added instead of a rescaled
        second pass: an upper bound, for a difference from the reference, which is exactly zero wherever a kernel
        matches the reference and would otherwise cost a second pass over every chunk."""
        import torch

        norm, shift = float(torch.linalg.vector_norm(x)), 0
        tiny = torch.finfo(x.dtype).tiny
        # Each square that underflowed was under finfo.tiny: below this floor they could be 2**-40 of the sum.
        lost = math.sqrt(max(x.numel(), 1) * tiny)
        if norm < lost * 2.0 ** 20 and lost <= slack:
            norm = math.sqrt(norm * norm + lost * lost)
        elif not lost * 2.0 ** 20 <= norm < math.inf:
            peak = float(x.abs().max())
            if peak == 0.0:
                return 0.0
            shift = math.frexp(peak)[1]
            y, left = x.to(torch.float64), -shift
            while left:  # multiplying by a power of two is exact; steps that float64 can hold
                step = max(-1000, min(1000, left))
                y = y * 2.0 ** step
                left -= step
            norm = float(torch.linalg.vector_norm(y))
        if norm == 0.0:
            return 0.0
        mant, exp = math.frexp(norm)
        sq, exp = mant * mant, exp + shift
        if self.mant == 0.0 or exp > self.exp:
            self.mant, self.exp = sq + math.ldexp(self.mant, 2 * (self.exp - exp)), exp
        else:
            self.mant += math.ldexp(sq, 2 * (exp - self.exp))
        return _ldexp(norm, shift)

    def norm(self) -> float:
        return _ldexp(math.sqrt(self.mant), self.exp)

    def rms(self, n: int) -> float:
        return _ldexp(math.sqrt(self.mant / max(n, 1)), self.exp)

    def over(self, den: _SumSq) -> float:
        """This norm over ``den``'s, or this norm alone where ``den`` is zero."""
        if den.mant == 0.0:
            return self.norm()
        return _ldexp(math.sqrt(self.mant / den.mant), self.exp - den.exp)


def _ldexp(x: float, exp: int) -> float:
    try:
        return math.ldexp(x, exp)
    except OverflowError:
        return math.inf


def _fast_pass(r: Any, o: Any, atol: float, rtol: float, scale: float | None = None) -> bool:
    """True when every element is within tolerance and the relative L2 error is under rtol, computed chunk by
    chunk in fp32 (fp64 for fp64 outputs), by the exact pass's rules: NaN and inf must match position for position
    (NaN for NaN, inf of the same sign) and the rest is held to the bound. False means "not shown to pass": the
    exact pass decides. The NaN-input trial of every judgment comes here with NaN in the reference, so NaN is
    handled here rather than sent to the float64 pass over the whole output."""
    import torch

    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    bound = atol * (_output_scale(r) if scale is None else scale)
    rf, of = r.reshape(-1), o.reshape(-1)
    num, den = _SumSq(), _SumSq()
    loose, limit = 0, _loose_limit(rf.numel())
    for s in range(0, rf.numel(), _CHUNK):
        a = rf[s:s + _CHUNK].to(work)
        b = of[s:s + _CHUNK].to(work)
        d = b - a
        excess = d.abs().sub_(a.abs().mul_(rtol))
        e = float(excess.max())
        if e != e or e == float("inf"):
            # NaN or inf on either side (a finite excess means both sides are finite), or a difference past the
            # dtype's range: positions must match.
            fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
            nan_a, nan_b = torch.isnan(a), torch.isnan(b)
            if bool((~(fin_a & fin_b) & ((nan_a != nan_b) | (~nan_a & (a != b)))).any()):
                return False
            # Zero where either side is not finite: those positions matched above, and a zero adds nothing to
            # the norms and 0 to the excess, which the (non-negative) bound always admits.
            both = fin_a & fin_b
            a, d = torch.where(both, a, 0.0), torch.where(both, d, 0.0)
            excess = d.abs().sub_(a.abs().mul_(rtol))
            e = float(excess.max())
        if not e <= bound:
            return False
        if bound > atol:
            loose += int(((excess > atol) & (a != 0)).sum())
            if loose > limit:
                return False
        # An error overstated by a thousandth of rtol can only send a borderline case to the exact pass.
        num.add(d, slack=1e-3 * rtol * den.add(a))
    # Within a hair of the bound the fp32 sums could disagree with float64: let the exact pass decide.
    return num.over(den) <= rtol * 0.999


def _closer_than_eager(r: Any, o: Any, t: Any, atol: float, rtol: float, scale: float | None = None) -> bool:
    """True when every element of ``o`` is within eager's own distance from the float64 result ``t``, plus ``atol``
    (scaled as for eager's bound) and ``rtol`` of the result, and the output's L2 distance from ``t`` is within
    eager's plus ``rtol`` of ``t``'s norm. Any NaN or inf on any side leaves the decision to the bound on eager
    alone."""
    import torch

    bound = atol * (_output_scale(r) if scale is None else scale)
    rf, of, tf = r.reshape(-1), o.reshape(-1), t.reshape(-1)
    eager, dist, true = _SumSq(), _SumSq(), _SumSq()
    for s in range(0, rf.numel(), _CHUNK):
        a = rf[s:s + _CHUNK].to(torch.float32)
        b = of[s:s + _CHUNK].to(torch.float32)
        c = tf[s:s + _CHUNK].to(torch.float32)
        if not bool(torch.isfinite(a).all() and torch.isfinite(b).all() and torch.isfinite(c).all()):
            return False
        own, off = a - c, b - c
        if not bool(torch.isfinite(own).all() and torch.isfinite(off).all()):
            return False  # a difference past fp32's range: the float64 pass on eager's bound decides
        if not float((off.abs() - own.abs() - c.abs() * rtol).max()) <= bound:
            return False
        eager.add(own)
        dist.add(off)
        true.add(c)
    # Norms of fp32 values are within float64's range, so the sums of squares convert to norms exactly enough.
    return dist.norm() <= eager.norm() + rtol * true.norm()


def _nan_reached(truth: Any) -> Any:
    """Where the float64 rerun ``truth`` has NaN, or None where there is no rerun or no NaN in it."""
    import torch

    if truth is None or not truth.is_floating_point():
        return None
    mask = torch.isnan(truth)
    return mask if bool(mask.any()) else None


def _exact(r: Any, o: Any, atol: float, rtol: float, trial: int, i: int,
           dist: str, scale: float | None = None, nan_reached: Any = None) -> tuple[Mismatch | None, str | None]:
    import torch

    nan_dropped = nan_added = 0
    if not r.is_floating_point():
        bad = o != r
        rel_l2 = float(bad.float().mean())
        diff = (o.to(torch.float64) - r.to(torch.float64)).abs()
    else:
        r64, o64 = r.to(torch.float64), o.to(torch.float64)
        diff = (o64 - r64).abs()
        unscaled = atol
        atol = atol * (_output_scale(r) if scale is None else scale)
        bound = atol + rtol * r64.abs()
        # Where either side is NaN or inf the other must be the same (NaN for NaN, inf of the same sign).
        ref_nan, out_nan = torch.isnan(r64), torch.isnan(o64)
        special = ref_nan | out_nan | torch.isinf(r64) | torch.isinf(o64)
        added = out_nan & ~ref_nan
        if nan_reached is not None:
            # NaN that a NaN input reaches in the float64 rerun, where eager skipped the tap that carried it.
            added &= ~nan_reached.to(added.device)
        bad = torch.where(special, (ref_nan & ~out_nan) | added | (~ref_nan & ~out_nan & (o64 != r64)),
                          diff > bound)
        # Past LOOSE_SHARE of the output, every element that passes only through the scale counts as wrong.
        loose = ~special & (r64 != 0) & (diff > unscaled + rtol * r64.abs())
        if int(loose.sum()) > _loose_limit(r.numel()):
            bad |= loose
        nan_dropped, nan_added = int((ref_nan & ~out_nan).sum()), int(added.sum())
        finite = torch.isfinite(r64) & torch.isfinite(o64)
        num, den = _SumSq(), _SumSq()
        num.add(torch.where(finite, o64 - r64, 0.0))
        den.add(torch.where(finite, r64, 0.0))
        rel_l2 = num.over(den)
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
