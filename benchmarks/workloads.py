"""The llm-ops suite: the serving ops of a Llama-class model as KernelBench-format problems.

Every workload is *problem source text* (``Model``, ``get_inputs``, ``get_init_inputs``), so it has the same
canonical key as the problem a user would hand to ``kernelsmith evolve`` and the kernel cache can be asked for it.
The bf16 prefill variants compute exactly what the catalogue's problem files (``ks_inductor/catalogue/problems/``)
compute, on the same shapes, so they share their keys (a test holds us to that). Shapes follow the anchor run in ``shared/anchors/measure_peers.py``:
hidden 4096, MLP 14336, softmax over 32000, cross-entropy over 32064 classes (fp32 logits, forward), RoPE with
32 query heads and 8 key heads of dimension 128, and a GEMM with a GELU epilogue (4096 x 14336 weights).

Prefill is 4096 tokens; decode is 16 tokens (16 sequences, one new token each).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

OPS = ("rmsnorm", "layernorm", "softmax", "silu_mul", "rope", "cross_entropy", "gemm_gelu")
DTYPES = ("bfloat16", "float16")
PHASES = ("prefill", "decode")
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Dims:
    """Model dimensions and token counts; ``FULL`` is the real suite, ``SMOKE`` exercises the runner on CPU."""

    hidden: int = 4096
    intermediate: int = 14336
    vocab_softmax: int = 32000
    vocab_ce: int = 32064
    q_heads: int = 32
    k_heads: int = 8
    head_dim: int = 128
    tokens: dict[str, int] = field(default_factory=lambda: {"prefill": 4096, "decode": 16})


FULL = Dims()
SMOKE = Dims(hidden=64, intermediate=96, vocab_softmax=80, vocab_ce=72, q_heads=4, k_heads=2, head_dim=16,
             tokens={"prefill": 8, "decode": 2})


@dataclass(frozen=True)
class Workload:
    name: str
    op: str
    dtype: str
    phase: str
    shape: str
    source: str

    def problem(self) -> Problem:
        from ks_inductor.problem_tracing import problem_from_source

        return problem_from_source(self.source, name=self.name, filename=f"<workload {self.name}>")


_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def _rmsnorm(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""RMSNorm as LLMs write it by hand (Llama style), {dt}, {t} tokens x {d.hidden}."""
{_HEADER}class Model(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim, dtype=torch.{dt}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def get_inputs():
    return [torch.randn({t}, {d.hidden}, dtype=torch.{dt})]


def get_init_inputs():
    return [{d.hidden}, 1e-6]
'''
    return src, f"{t}x{d.hidden}"


def _layernorm(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""LayerNorm over the last dim with affine weight and bias, {dt}, {t} tokens x {d.hidden}."""
{_HEADER}class Model(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(dim, dtype=torch.{dt}))
        self.bias = nn.Parameter(torch.randn(dim, dtype=torch.{dt}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


def get_inputs():
    return [torch.randn({t}, {d.hidden}, dtype=torch.{dt})]


def get_init_inputs():
    return [{d.hidden}, 1e-5]
'''
    return src, f"{t}x{d.hidden}"


def _softmax(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""Softmax over the vocabulary dimension of {dt} logits, {t} tokens x {d.vocab_softmax}."""
{_HEADER}class Model(nn.Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn({t}, {d.vocab_softmax}, dtype=torch.{dt})]


def get_init_inputs():
    return [-1]
'''
    return src, f"{t}x{d.vocab_softmax}"


def _silu_mul(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""SwiGLU activation SiLU(gate) * up, {dt}, {t} tokens x {d.intermediate}."""
{_HEADER}class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn({t}, {d.intermediate}, dtype=torch.{dt}), torch.randn({t}, {d.intermediate}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''
    return src, f"{t}x{d.intermediate} (x2)"


def _rope(dt: str, t: int, d: Dims, phase: str) -> tuple[str, str]:
    # Prefill: one sequence of t tokens at positions 0..t-1. Decode: t sequences, one new token each, at
    # scattered positions (their cached lengths), so cos/sin carry one row per sequence.
    if phase == "prefill":
        batch, seq, positions = 1, t, f"torch.arange({t}).float()[None]"
    else:
        batch, seq, positions = t, 1, f"torch.randint(1, 2048, ({t}, 1)).float()"
    src = f'''"""Rotary position embedding (rotate-half form) on q ({d.q_heads} heads) and k ({d.k_heads} heads), {dt},
batch {batch}, {seq} token(s) per sequence, head dim {d.head_dim}."""
{_HEADER}def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c = cos.unsqueeze(1)
        s = sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def get_inputs():
    q = torch.randn({batch}, {d.q_heads}, {seq}, {d.head_dim}, dtype=torch.{dt})
    k = torch.randn({batch}, {d.k_heads}, {seq}, {d.head_dim}, dtype=torch.{dt})
    pos = {positions}
    inv = 1.0 / (10000 ** (torch.arange(0, {d.head_dim}, 2).float() / {d.head_dim}))
    freqs = pos[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return [q, k, emb.cos().to(torch.{dt}), emb.sin().to(torch.{dt})]


def get_init_inputs():
    return []
'''
    return src, f"q {batch}x{d.q_heads}x{seq}x{d.head_dim}, k {batch}x{d.k_heads}x{seq}x{d.head_dim}"


def _cross_entropy(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""Cross-entropy (mean over rows) of {dt} logits against class indices, forward only, {t} x {d.vocab_ce}."""
{_HEADER}class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target)


def get_inputs():
    return [torch.randn({t}, {d.vocab_ce}, dtype=torch.{dt}), torch.randint(0, {d.vocab_ce}, ({t},))]


def get_init_inputs():
    return []
'''
    return src, f"{t}x{d.vocab_ce}"


def _gemm_gelu(dt: str, t: int, d: Dims) -> tuple[str, str]:
    src = f'''"""A GEMM with a pointwise epilogue: GELU(tanh)(a @ b), {dt}, {t} x {d.hidden} @ {d.hidden} x {d.intermediate}."""
{_HEADER}class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(a @ b, approximate="tanh")


def get_inputs():
    return [torch.randn({t}, {d.hidden}, dtype=torch.{dt}), torch.randn({d.hidden}, {d.intermediate}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''
    return src, f"{t}x{d.hidden} @ {d.hidden}x{d.intermediate}"


def _build(op: str, dt: str, phase: str, d: Dims) -> Workload:
    t = d.tokens[phase]
    if op == "rope":
        src, shape = _rope(dt, t, d, phase)
    else:
        src, shape = {"rmsnorm": _rmsnorm, "layernorm": _layernorm, "softmax": _softmax, "silu_mul": _silu_mul,
                      "cross_entropy": _cross_entropy, "gemm_gelu": _gemm_gelu}[op](dt, t, d)
    return Workload(name=f"{op}-{_SHORT.get(dt, dt)}-{phase}", op=op, dtype=dt, phase=phase, shape=shape,
                    source=src)


def llm_ops_workloads(ops: Iterable[str] | None = None, dtypes: Iterable[str] | None = None,
                      phases: Iterable[str] | None = None, dims: Dims = FULL) -> list[Workload]:
    """The suite, filtered. Cross-entropy always runs on fp32 logits (as serving computes the loss), whatever
    the dtype filter says, and appears once per phase."""
    ops = list(ops or OPS)
    dtypes = list(dtypes or DTYPES)
    phases = list(phases or PHASES)
    for name, given, allowed in (("op", ops, OPS), ("dtype", dtypes, DTYPES + ("float32",)),
                                 ("phase", phases, PHASES)):
        bad = [x for x in given if x not in allowed]
        if bad:
            raise ValueError(f"unknown {name} {', '.join(bad)}; choose from {', '.join(allowed)}")
    out = []
    for op in ops:
        for phase in phases:
            if op == "cross_entropy":
                out.append(_build(op, "float32", phase, dims))
                continue
            for dt in dtypes:
                if dt == "float32":
                    continue
                out.append(_build(op, dt, phase, dims))
    return out


def export_problems(workloads: Iterable[Workload], folder: str | Path) -> list[Path]:
    """Write each workload as a problem file, ready for ``kernelsmith evolve`` / ``kernelsmith warm``."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for w in workloads:
        p = root / f"{w.name.replace('-', '_')}.py"
        p.write_text(w.source)
        paths.append(p)
    return paths
