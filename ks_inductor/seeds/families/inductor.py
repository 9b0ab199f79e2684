"""The generic family: Inductor's own kernels as a template, a seed for every problem Inductor compiles to Triton.

The variants are Inductor's code generations (its own choice, looped reductions, native matmul, and its
max-autotune GEMM/convolution templates); the parameters are each kernel's launch configuration (block sizes, warps,
stages; a template's block sizes are constants of its source, so only its warps and stages), seeded at the
configurations Inductor's heuristics would autotune over and moved from there by the embedded mutator, more widely
than Inductor's coordinate descent does. It applies to every family, so where an op-family template also matches,
both compete in the same archive.
"""

from __future__ import annotations

import math
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    MAX_ELEMS_PER_THREAD,
    Template,
    TemplateError,
    _state_lines,
    block_class,
)
from ks_inductor.seeds.graph import Graph
from ks_inductor.seeds.inductor import InductorProgram, SeedUnavailable, inductor_programs
from ks_inductor.seeds.inductor.program import MAX_BLOCK
from ks_inductor.seeds.inductor.render import kernel_params, param_name, render_program

_WARPS = [1, 2, 4, 8, 16, 32]
_STAGES = [1, 2, 3, 4]
# Further seeds from Inductor's autotuning list (its configurations beyond the first), on a timed device.
MAX_ALTERNATES = 6
# The largest tile a program may hold (Triton's limit on a tensor's elements).
MAX_TILE = 1 << 20
_NUMEL = {"XBLOCK": "xnumel", "YBLOCK": "ynumel", "ZBLOCK": "znumel", "R0_BLOCK": "r0_numel", "R1_BLOCK": "r1_numel"}


class InductorTemplate(Template):
    name = "inductor"

    def _programs(self, fm: FamilyMatch) -> dict[str, InductorProgram]:
        return inductor_programs(fm.problem, fm.target)[0]

    def _program(self, fm: FamilyMatch, variant: str) -> InductorProgram:
        progs = self._programs(fm)
        if variant not in progs:
            raise TemplateError(f"Inductor made no {variant} program for {fm.problem.name}")
        return progs[variant]

    def unavailable(self, fm: FamilyMatch) -> dict[str, str]:
        """Why Inductor's code gave no seed, by variant (for ``explain`` and the evolver's error)."""
        return inductor_programs(fm.problem, fm.target)[1]

    def applicable(self, fm: FamilyMatch) -> bool:
        return bool(self._programs(fm))

    def variants(self, fm: FamilyMatch) -> list[str]:
        return list(self._programs(fm))

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        prog = self._program(fm, variant)
        out: dict[str, list[Any]] = {}
        for i, k in enumerate(prog.kernels):
            numels = _kernel_numels(prog, i)
            for key in k.config_keys:
                seen = sorted({c.kwargs[key] for c in k.configs})
                if key in k.tunable_blocks():
                    top = MAX_BLOCK[key]
                    if _NUMEL.get(key) in numels:
                        top = min(top, max(seen + [1 << max(0, math.ceil(math.log2(max(1, numels[_NUMEL[key]]))))]))
                    values = sorted({1 << e for e in range(0, int(math.log2(top)) + 1)} | set(seen))
                    # Blocks below Inductor's smallest tile only starve the GPU; keep a few steps under it.
                    floor = max(1, min(seen) // 8)
                    out[param_name(i, key)] = [v for v in values if v >= floor]
                else:
                    out[param_name(i, key)] = seen
            out[param_name(i, "num_warps")] = _WARPS
            out[param_name(i, "num_stages")] = _STAGES
        return out

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        prog = self._program(fm, variant)
        params = self._config_params(prog, [0] * len(prog.kernels))
        if device == "cpu":
            _widen_for_interpreter(prog, params)
        return params

    def alternates(self, fm: FamilyMatch, variant: str, device: str) -> list[dict[str, Any]]:
        if device == "cpu":
            return []  # the interpreter times nothing: one seed per variant says all it can
        prog = self._program(fm, variant)
        out: list[dict[str, Any]] = []
        for i, k in enumerate(prog.kernels):
            for j in range(1, len(k.configs)):
                choice = [0] * len(prog.kernels)
                choice[i] = j
                out.append(self._config_params(prog, choice))
        return out[:MAX_ALTERNATES]

    @staticmethod
    def _config_params(prog: InductorProgram, choice: list[int]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for i, (k, j) in enumerate(zip(prog.kernels, choice)):
            cfg = k.configs[j]
            params.update({param_name(i, key): v for key, v in cfg.kwargs.items()})
            params[param_name(i, "num_warps")] = cfg.num_warps
            params[param_name(i, "num_stages")] = cfg.num_stages
        return params

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        prog = self._program(fm, variant)
        for i, k in enumerate(prog.kernels):
            blocks, warps, _ = kernel_params(params, i, k)
            if any(k.configs[j].kwargs == blocks for j in range(len(k.configs))):
                continue  # Inductor's own tile
            tile = math.prod(blocks.values()) * _fixed_r0(k)
            if tile > MAX_TILE or tile / (32 * warps) > 2 * MAX_ELEMS_PER_THREAD:
                return False
        return True

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        prog = self._program(fm, variant)
        tensor_inputs = [s.kind == "tensor" for s in fm.problem.input_specs]
        try:
            return render_program(
                prog, params, target=fm.target, state=[e.name for e in fm.state], state_lines=_state_lines(fm.state),
                init_signature=fm.init_signature, tensor_inputs=tensor_inputs,
                doc=f"{fm.problem.name}: Inductor's kernels ({variant}), launch parameters {params}")
        except SeedUnavailable as e:
            raise TemplateError(str(e)) from None

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        prog = self._program(fm, variant)
        blocks, warps, stages = kernel_params(params, 0, prog.kernels[0])
        return {"block": block_class(_tile(prog.kernels[0], blocks)), "warps": warps,
                "stages": stages, "dot": "tl.dot(" in prog.kernels[0].source, "fusion": 1.0 / len(prog.kernels),
                "persistent": prog.kernels[0].persistent, "variant": f"inductor/{variant}"}


# The interpreter pays per program, not per element: a seed judged there takes tiles this large where it can.
INTERPRETER_TILE = 16384


def _widen_for_interpreter(prog: InductorProgram, params: dict[str, Any]) -> None:
    """Double each kernel's tunable blocks (X first, then the reduction's) while its tile stays under
    ``INTERPRETER_TILE`` and its dimension has elements to fill them: the same kernel in far fewer programs."""
    for i, k in enumerate(prog.kernels):
        numels = _kernel_numels(prog, i)
        for key in ("XBLOCK", "YBLOCK", "R0_BLOCK"):
            name = param_name(i, key)
            if key not in k.tunable_blocks() or name not in params:
                continue
            while True:
                blocks = kernel_params(params, i, k)[0]
                tile = math.prod(blocks.values()) * _fixed_r0(k)
                if (tile * 2 > INTERPRETER_TILE or params[name] * 2 > MAX_BLOCK[key]
                        or params[name] >= numels.get(_NUMEL[key], 1)):
                    break
                params[name] *= 2


def _kernel_numels(prog: InductorProgram, index: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for step in prog.steps:
        if step.get("launch") == index:
            for k, v in step["numels"].items():
                out[k] = max(out.get(k, 0), v)
    return out


def _tile(kernel: Any, blocks: dict[str, int]) -> int:
    """Elements of one program's tile: a template's output tile is fixed in its source."""
    if kernel.template_blocks:
        return kernel.template_blocks.get("BLOCK_M", 1) * kernel.template_blocks.get("BLOCK_N", 1)
    return math.prod(blocks.values()) * _fixed_r0(kernel)


def _fixed_r0(kernel: Any) -> int:
    """A persistent reduction's whole-row block, written into its source rather than set by a config."""
    if not kernel.persistent:
        return 1
    for line in kernel.source.splitlines():
        line = line.strip()
        if line.startswith("R0_BLOCK: tl.constexpr ="):
            return int(line.split("=")[1])
    return 1


# The family of a problem no op-family template covers: its seeds come from Inductor's kernels alone.
GENERIC = "inductor"
INDUCTOR = InductorTemplate()


def match(graph: Graph) -> dict[str, Any] | None:
    return {}


register(Family(GENERIC, priority=1000, match=match, templates=(INDUCTOR,), generic=True))
