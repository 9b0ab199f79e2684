"""Fresh trial inputs from varied distributions, reproducible from (seed, distribution) in any process.

The reference process and the candidate's worker each rebuild the same inputs from the same seed, so tensors never
have to cross the process boundary on the way in. Floating-point inputs are redrawn from the trial's distribution
(not only [0, 1)); integer and boolean inputs keep the problem's own ``get_inputs()`` draw, since they often carry
structure (class indices, positions) that a random redraw would break.
"""

from __future__ import annotations

import types
from typing import Any

# Distributions for floating-point inputs. "native" is the problem's own get_inputs() draw. "nan" is uniform_neg with
# a sprinkle of NaN: torch propagates NaN through max, min, clamp and relu, and a kernel that drops it (IEEE maxNum,
# Triton's default) hides a model's NaN from its user. The rest of the values still check the arithmetic.
_SCALE = {"normal": (1.0, 0.0), "uniform_neg": (1.0, 0.0), "nan": (1.0, 0.0), "large": (100.0, 0.0),
          "normal_shifted": (1.0, 2.0)}
# One NaN per this many elements (at least one per tensor): sparse enough that a row-wise op keeps rows without one.
NAN_EVERY = 65536


def trial_plan(n_trials: int, distributions: tuple[str, ...], base_seed: int) -> list[tuple[int, str]]:
    """(seed, distribution) per trial, cycling through the distributions so each one is exercised."""
    return [(base_seed + 1000 + i, distributions[i % len(distributions)]) for i in range(n_trials)]


def _needs_native(specs: list[dict]) -> bool:
    return any(s["kind"] == "tensor" and not _is_float(s["dtype"]) for s in specs)


def _is_float(dtype: str) -> bool:
    return dtype in ("float16", "bfloat16", "float32", "float64")


def make_inputs(mod: types.ModuleType, specs: list[dict], seed: int, dist: str, device: str) -> list[Any]:
    import torch

    native: list[Any] | None = None
    if dist == "native" or _needs_native(specs):
        torch.manual_seed(seed)
        # Drawn on the trial's device: KernelBench's inputs reach 16 GiB (avg pool 2d), more than the worker may
        # hold in host memory, and a host draw would cross to the device once more for every trial.
        with torch.device(device):
            native = list(mod.get_inputs())
    if dist == "native":
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in native or []]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    scale, shift = _SCALE[dist]
    out: list[Any] = []
    for i, s in enumerate(specs):
        if s["kind"] != "tensor":
            out.append(native[i] if native is not None else s["value"])
            continue
        dtype = getattr(torch, s["dtype"])
        if not _is_float(s["dtype"]):
            out.append(native[i].to(device))  # type: ignore[index]
            continue
        t = torch.empty_strided(s["shape"], s["stride"], dtype=torch.float32, device=device)
        if dist in ("uniform_neg", "nan"):
            t.uniform_(-1.0, 1.0, generator=gen)
        else:
            t.normal_(shift, 1.0, generator=gen)
        if scale != 1.0:
            t.mul_(scale)
        if dist == "nan" and t.numel():
            flat = torch.randint(0, t.numel(), (1 + t.numel() // NAN_EVERY,), generator=gen, device=device)
            t[torch.unravel_index(flat, tuple(t.shape))] = float("nan")
        x = torch.empty_strided(s["shape"], s["stride"], dtype=dtype, device=device)
        x.copy_(t)
        out.append(x)
    return out


def build_model(mod: types.ModuleType, cls_name: str, init_seed: int, device: str) -> Any:
    import torch

    torch.manual_seed(init_seed)
    return place_model(getattr(mod, cls_name)(*mod.get_init_inputs()), device)


def place_model(model: Any, device: str) -> Any:
    """``model`` on ``device``, in the mode its constructor left it in.

    That is training mode for an ``nn.Module``: KernelBench's harness never calls ``eval()``, and the problem's
    graph (``trace_problem_module``) is traced from the model as built. In eval mode a batch norm would be judged
    by running statistics the traced graph never reads, and a dropout would vanish from the reference.
    """
    return model.to(device)


def same_layout(x: Any) -> Any:
    """A copy of ``x`` at its own sizes and strides (a tensor; anything else as it is). ``clone`` makes an input
    whose strides leave gaps contiguous, and a launch plan addresses its inputs at the strides it was recorded at."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
