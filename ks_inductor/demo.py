"""The README's main job: warm a small model's kernels, compile it with backend="kernelsmith", check the result.

    python -m ks_inductor.demo [--db URL] [--budget N]

On a CPU machine this runs the whole pipeline through the Triton interpreter: the embedded mutator proposes
kernels from the op-family templates, the judge verifies them in worker processes, the verified winners go to
the kernel cache, and the compiled model's regions are served from it. Interpreter timings mean nothing, so the
kernels are stored untimed and the point here is the pipeline and correctness, not speed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from ks_core.settings import Settings


def build_model():
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        """A pre-norm MLP block: RMSNorm, up projection, GELU, down projection, residual."""

        def __init__(self, dim: int = 64, hidden: int = 128) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(dim, eps=1e-6)
            self.up = nn.Linear(dim, hidden)
            self.down = nn.Linear(hidden, dim)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(0)
    return Block().eval(), (torch.randn(8, 64),)


@contextlib.contextmanager
def scratch_db(db: str | None) -> Iterator[str]:
    """``db``, or a fresh SQLite cache in a temporary folder that is removed when the demo ends; the demo's other
    files (graph analyses, kernel modules, Inductor's cache) go there too unless the environment names their
    folders, so that a demo run leaves nothing behind."""
    if db is not None:
        yield db
        return
    with tempfile.TemporaryDirectory(prefix="kernelsmith-demo-") as folder:
        # Inductor's cache too: its default is a folder of the temp directory that outlives the run.
        own = {k: os.path.join(folder, sub) for k, sub in (("KERNELSMITH_HOME", "home"),
                                                             ("TORCHINDUCTOR_CACHE_DIR", "inductor"))
               if k not in os.environ}
        os.environ.update(own)
        try:
            yield "sqlite:///" + os.path.join(folder, "kernels.db")
        finally:
            for k in own:
                os.environ.pop(k, None)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a fresh SQLite file in a temporary "
                                                   "folder, removed at the end)")
    parser.add_argument("--budget", type=int, default=4, help="judgments per region (default 4)")
    args = parser.parse_args(argv)
    with scratch_db(args.db) as db:
        return run(db, args.budget)


# Wide enough that no column of a table printed to a pipe or a file is ever cut.
UNCUT_WIDTH = 1 << 15


def print_uncut(console: Any, table: Any) -> None:
    """Print ``table`` whole: fitted to a terminal, as wide as its contents anywhere else (``make demo | cat``
    would otherwise get 80 columns and cut cells)."""
    from rich.console import Console

    if console.is_terminal:
        console.print(table)
    else:  # a console's own width caps what one print may take, so a wide one prints the table
        Console(file=console.file, width=UNCUT_WIDTH, no_color=console.no_color, highlight=False).print(table)


def run(db: str, budget: int) -> int:
    """Warm the block's regions into ``db``, compile it with the backend, and check what was served."""
    import torch
    from rich.console import Console

    from kernel_cache.access import open_store
    from ks_inductor.compiler.explain import explain
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import problems_from_model, warm

    console = Console()
    backend = "triton-interpret" if Settings.read("triton_interpret") else None
    model, inputs = build_model()
    console.rule("1. regions of the model")
    store = open_store(db)
    problems = problems_from_model(model, inputs, judge_backend=backend, store=store)
    console.print(f"{len(problems)} regions; kernel cache at {store.where}")

    console.rule("2. warm: evolve and verify a kernel per region (embedded mutator, no LLM)")
    t0 = time.perf_counter()
    summary = warm(problems, store, EvolveConfig(budget=budget, backend=backend), console=console)
    console.print(f"warmed in {time.perf_counter() - t0:.1f} s")
    found = [i for i in summary.items if i.status in ("found", "skipped")]

    console.rule('3. torch.compile(model, backend="kernelsmith")')
    from ks_inductor.compiler.backend import compile_reports

    n_reports = len(compile_reports())
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db})
    with torch.no_grad():
        got = compiled(*inputs)
        want = model(*inputs)
    # What the compile itself swapped in, not what a lookup would find: a kernel that fails to load falls back.
    swapped = sum(r.swapped for r in compile_reports()[n_reports:])
    report = explain(model, *inputs, judge_backend=backend, store=store)
    print_uncut(console, report.table())
    err = (got - want).abs().max().item()
    console.print(f"regions served from the cache: {swapped} of {len(report.regions)}; "
                  f"largest difference from eager: {err:.3g}")
    store.close()
    if swapped == 0 or not found:
        console.print("[red]no region was served from the cache[/]")
        return 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    console.print("[green]outputs match eager[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
