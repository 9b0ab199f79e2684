"""Problem sources: KernelBench's form written from a forward's body (``module``, ``norm_module``), and the serving
problems of ``problems/`` at test sizes (``shrink``, ``small_problem``)."""

from __future__ import annotations

import re

from ks_core.problem_record import Problem
from ks_inductor.catalogue import PROBLEM_DIR
from ks_inductor.problem_tracing import problem_from_source

# The serving ops' problems, by file name: what a served LLM layer runs.
SERVING = ["rmsnorm_bf16", "layernorm_bf16", "softmax_bf16", "silu_mul_bf16", "rope_bf16", "cross_entropy_fp32",
           "gemm_gelu_bf16"]

SMALL = {"batch_size": 4, "dim": 48, "num_classes": 40, "q_heads": 2, "k_heads": 1, "seq_len": 8,
         "head_dim": 16, "M": 24, "K": 20, "N": 28}


def shrink(src: str, **sizes: int) -> str:
    """The benchmark problems at test shapes: their module-level size constants replaced (``sizes`` over SMALL)."""
    table = {**SMALL, **sizes}
    return re.sub(r"^([A-Za-z_]+) = \d+$", lambda m: f"{m.group(1)} = {table.get(m.group(1), m.group(0).split()[-1])}",
                  src, flags=re.M)


SMALL_FOR = {"rope_bf16": {"batch_size": 2}}


def small_problem(name: str) -> Problem:
    """The serving problem ``name`` (a file of ``problems/``) at test sizes."""
    src = shrink((PROBLEM_DIR / f"{name}.py").read_text(), **SMALL_FOR.get(name, {}))
    return problem_from_source(src, name=name)


def module(forward: str, inputs: str, init: str = "", init_args: str = "[]", sig: str = "") -> str:
    """A problem's KernelBench source: ``forward`` the body of ``Model.forward(self, *xs)``, ``inputs`` the list
    ``get_inputs()`` returns, ``init`` the body of ``__init__`` (its signature after ``self``: ``sig``)."""
    return f'''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self{sig}):
        super().__init__()
{init or "        pass"}

    def forward(self, *xs):
{forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_args}
'''


def norm_module(ctor: str, inputs: str, affine: bool = True) -> str:
    """A problem applying the norm layer ``ctor`` to its input; an affine weight and bias drawn at random (not the
    ones and zeros torch starts from, which would hide a missing or misplaced affine step)."""
    init = f"        self.norm = {ctor}"
    if affine:
        init += "\n        nn.init.normal_(self.norm.weight); nn.init.normal_(self.norm.bias)"
    return module("        return self.norm(xs[0])", inputs, init=init)
