"""Do the templates' seeds keep NaN and inf where eager does?

Renders every variant's default configuration of every template that takes one of the catalogue's problems
(``ks_inductor.catalogue``: the problems by family, those of the family contract and the serving problems at test
shapes), runs it on
inputs holding NaN, +inf and -inf, and compares where the outputs are NaN and infinite with eager's. The judge's
"nan" trial checks NaN on every judgment; this covers infinities too, on all variants at once, on CPU (the Triton
interpreter) or a GPU:

    TRITON_INTERPRET=1 python -m benchmarks.nan_probe cpu out.json
    python -m benchmarks.nan_probe cuda out.json

On CPU two renders of bias_gelu are reported: CPU eager's exact gelu gives NaN at +inf, where CUDA eager and the
kernel give inf. The judge does not feed infinities, for that reason among others.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

log = logging.getLogger("nan_probe")


def _sprinkle(x: Any, gen: Any) -> Any:
    import torch

    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() < 4:
        return x
    x = x.clone()
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[: max(3, flat.numel() // 97)]
    vals = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=x.dtype)
    flat[idx] = vals[torch.arange(idx.numel()) % 3]
    return x


def _compare(want: Any, got: Any) -> dict[str, int]:
    import torch

    if not want.is_floating_point():
        return {"int_mismatch": int((want != got.to(want.device)).sum())}
    w, o = want.double().cpu(), got.double().cpu()
    wn, on = torch.isnan(w), torch.isnan(o)
    inf_bad = ((torch.isinf(w) | torch.isinf(o)) & ~wn & ~on & (w != o)).sum()
    return {"nan_mismatch": int((wn != on).sum()), "inf_mismatch": int(inf_bad), "ref_nan": int(wn.sum()),
            "out_nan": int(on.sum()), "n": w.numel()}


def _run_one(problem: Problem, fm: Any, t: Any, variant: str, device: str, target: str, tmp: Path) -> list[dict]:
    import torch

    from ks_core.problem_record import exec_problem_source

    pm = exec_problem_source(problem.source)
    path = tmp / f"{problem.name}_{t.name}_{variant}.py"
    path.write_text(t.render(fm, t.default(fm, variant, target), variant))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    ref = pm.Model(*pm.get_init_inputs()).to(device)
    new = mod.ModelNew(*pm.get_init_inputs()).to(device)
    new.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(1)
    xs = [_sprinkle(x, gen) for x in pm.get_inputs()]
    xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
    with torch.no_grad():
        want, got = ref(*xs), new(*xs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    return [_compare(w, o) for w, o in zip(want, got)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", choices=["cpu", "cuda"])
    ap.add_argument("out")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from ks_inductor.catalogue import PROBLEM_DIR
    from ks_inductor.catalogue.families import CONTRACT_PROBLEMS, FAMILY_PROBLEMS
    from ks_inductor.catalogue.sources import shrink
    from ks_inductor.problem_tracing import problem_from_source
    from ks_inductor.seeds.families import classify, templates_for

    target = "cuda" if args.device == "cuda" else "cpu"
    problems = {n: problem_from_source(src, name=n)
                for n, (src, fam) in {**FAMILY_PROBLEMS, **CONTRACT_PROBLEMS}.items() if fam}
    for p in PROBLEM_DIR.glob("*.py"):
        try:
            problems[p.stem] = problem_from_source(shrink(p.read_text()), name=p.stem)
        except Exception as e:  # a problem that does not trace at test shapes (GQA head counts) is skipped
            log.info("skip %s: %s", p.stem, str(e)[:120])
    tmp = Path(tempfile.mkdtemp(prefix="nan_probe-"))
    rows = []
    for name, problem in sorted(problems.items()):
        fm = classify(problem)
        if fm is None or fm.family is None:
            continue
        fm.target = target
        for t in templates_for(fm):
            for v in t.variants(fm):
                row: dict[str, Any] = {"problem": name, "template": t.name, "variant": v}
                try:
                    row["result"] = _run_one(problem, fm, t, v, args.device, target, tmp)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                ok = "error" not in row and not any(c.get("nan_mismatch") or c.get("inf_mismatch")
                                                    or c.get("int_mismatch") for c in row["result"])
                row["ok"] = ok
                rows.append(row)
                log.info("%s %s %s/%s %s", "ok " if ok else "BAD", name, t.name, v, row.get("result", row.get("error")))
    Path(args.out).write_text(json.dumps(rows, indent=1))
    log.info("%d of %d renders keep NaN and inf where eager does", sum(r["ok"] for r in rows), len(rows))


if __name__ == "__main__":
    main()
