"""Comparing a candidate's outputs with the reference's, in the judge's own process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ks_inductor.judge.verdict import Mismatch


def compare_outputs(
    ref: list[Any], out: list[Any], tolerance: Callable[[str], tuple[float, float]], trial: int, dist: str
) -> tuple[Mismatch | None, str | None]:
    """Return (mismatch statistics, reason) for the first output that fails, or (None, None) when all pass.

    An element passes when |out - ref| <= atol + rtol * |ref|; the whole output must also keep its relative L2
    error under rtol, so an all-zero answer cannot hide under atol when the true values are tiny. NaN in the
    output never passes.
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
        if not r.is_floating_point():
            bad = o != r
            rel_l2 = float(bad.float().mean())
            diff = (o.to(torch.float64) - r.to(torch.float64)).abs()
            bound = torch.zeros_like(diff)
        else:
            r64, o64 = r.to(torch.float64), o.to(torch.float64)
            diff = (o64 - r64).abs()
            bound = atol + rtol * r64.abs()
            ref_nan = torch.isnan(r64)
            bad = (diff > bound) | (torch.isnan(o64) & ~ref_nan) | (torch.isinf(o64) & (o64 != r64))
            bad &= ~(ref_nan & torch.isnan(o64))
            finite = torch.isfinite(r64) & torch.isfinite(o64)
            num = float(torch.linalg.vector_norm(torch.where(finite, o64 - r64, 0.0)))
            den = float(torch.linalg.vector_norm(torch.where(finite, r64, 0.0)))
            rel_l2 = num / den if den > 0 else num
        n_bad = int(bad.sum())
        if n_bad or rel_l2 > rtol:
            diff_f = torch.nan_to_num(diff, nan=float("inf"))
            rel = diff_f / r.to(torch.float64).abs().clamp_min(1e-12)
            first = None
            if n_bad:
                flat = int(torch.nonzero(bad.reshape(-1))[0])
                first = [int(x) for x in torch.unravel_index(torch.tensor(flat), tuple(r.shape))]
            m = Mismatch(
                trial=trial, output_index=i, max_abs_error=float(diff_f.max()), max_rel_error=float(rel.max()),
                fraction_mismatched=n_bad / r.numel(), first_bad_index=first, rel_l2_error=rel_l2,
                distribution=dist, atol=atol, rtol=rtol,
            )
            why = (f"{n_bad} of {r.numel()} elements outside tolerance" if n_bad
                   else f"relative L2 error {rel_l2:.3g} above {rtol:g}")
            return m, f"trial {trial} ({dist} inputs): output {i} is wrong: {why}"
    return None, None
