"""Markdown table and plots from a benchmark result JSON (CPU only; no device needed).

    python -m benchmarks.report benchmarks/results/llm-ops-nvidia-h200-2026-11-21.json [-o FILE.md] [--no-plots]

Prints the markdown on stdout. With ``-o FILE.md`` it writes it there instead, with ``FILE-speedup.png``
(kernelsmith's speedup over each peer, per workload) and ``FILE-roofline.png`` (each tool's fraction of the
roofline floor, per workload) beside it unless ``--no-plots``; it writes nothing anywhere else (the runner writes
its result's report next to the JSON it measured).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from benchmarks.results import KERNELSMITH, NO_KERNEL, OK, UNAVAILABLE, RunResult, WorkloadResult, load_result

log = logging.getLogger(__name__)

_TOOL_ORDER = ("eager", "inductor", "inductor-max-autotune", "liger", "F.rms_norm", KERNELSMITH)


def tool_columns(result: RunResult) -> list[str]:
    seen: list[str] = []
    for w in result.workloads:
        for t in w.tools:
            if t not in seen:
                seen.append(t)
    ordered = [t for t in _TOOL_ORDER if t in seen] + [t for t in seen if t not in _TOOL_ORDER]
    # kernelsmith last, always, so the eye finds it.
    return [t for t in ordered if t != KERNELSMITH] + ([KERNELSMITH] if KERNELSMITH in ordered else [])


def fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "–"
    us = ms * 1e3
    if us < 1000:
        return f"{us:.2f} µs" if us < 10 else f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _cell(w: WorkloadResult, tool: str, notes: list[str]) -> str:
    t = w.tools.get(tool)
    if t is None:
        return ""
    if t.ok:
        return f"{fmt_ms(t.median_ms)} ±{fmt_ms(t.iqr_ms)}"
    if t.status == NO_KERNEL:
        return "no verified kernel"
    if t.status == UNAVAILABLE:
        return "n/a"
    notes.append(f"{w.name}, {tool}: {t.error or t.status}")
    return f"{t.status} [{len(notes)}]"


def _env_line(r: RunResult) -> str:
    e = r.env
    parts = [f"device {e.get('device_name', '?')}"]
    if e.get("driver"):
        parts.append(f"driver {e['driver']}")
    for k, label in (("cuda", "CUDA"), ("torch", "torch"), ("triton", "triton"), ("kernelsmith", "kernelsmith"),
                     ("liger_kernel", "liger-kernel"), ("python", "Python")):
        if e.get(k):
            parts.append(f"{label} {e[k]}")
    return ", ".join(parts)


def _ceilings_line(r: RunResult) -> str:
    c = r.ceilings or {}
    parts = []
    if c.get("copy_bytes_per_s"):
        parts.append(f"device-to-device copy {c['copy_bytes_per_s'] / 1e9:,.0f} GB/s (bytes read + written)")
    for dt, v in (c.get("matmul_flops_per_s") or {}).items():
        parts.append(f"{dt} 8192³ matmul {v / 1e12:,.0f} TFLOP/s")
    return "; ".join(parts) if parts else "not measured (CPU run): no roofline floors"


def closing_note(r: RunResult) -> list[str]:
    """Per workload: kernelsmith's ratio to the best peer and its fraction of the roofline floor."""
    lines = []
    for w in r.workloads:
        best = w.best_peer()
        best_txt = (f"best peer {best[0]} {fmt_ms(best[1].median_ms)}, {_pct(w.fraction_of_floor(best[0]))} of "
                    "the floor") if best else "no peer ran"
        ks = w.tools.get(KERNELSMITH)
        if ks is not None and ks.ok:
            sp = w.speedups.get(best[0]) if best else None
            lcb = f" (lower bound {sp.lcb:.2f}x)" if sp else ""
            lines.append(f"- **{w.name}**: kernelsmith {fmt_ms(ks.median_ms)} = {_ratio(w.ratio_to_best_peer())} "
                         f"the best peer{lcb}, {_pct(w.fraction_of_floor(KERNELSMITH))} of the floor; {best_txt}.")
        else:
            why = "no verified kernel" if ks is None or ks.status == NO_KERNEL else f"kernelsmith {ks.status}"
            lines.append(f"- **{w.name}**: {why}; {best_txt}.")
    return lines


def render_markdown(r: RunResult, plot_names: dict[str, str] | None = None) -> str:
    tools = tool_columns(r)
    out = []
    title = f"# {r.suite} on {r.env.get('device_name', '?')} ({r.created[:10]})"
    out.append(title + (" — SMOKE RUN, NOT A MEASUREMENT" if r.smoke else ""))
    out.append("")
    out.append(f"Measured {r.created} with `{r.command}`.")
    out.append("")
    out.append(f"Environment: {_env_line(r)}.")
    out.append("")
    out.append(f"Ceilings measured at the start of the run: {_ceilings_line(r)}. A workload's floor is the longer of "
               "its bytes at that copy rate and (for matmul-bearing workloads) its FLOPs at that matmul rate.")
    out.append("")
    p = r.protocol or {}
    if p:
        out.append("Protocol: every tool's output is checked against the problem's own reference (or, for bf16/fp16 "
                   "problems, the same model run in fp32) before it is timed; then all "
                   f"tools are timed in one process, {p.get('rounds')} interleaved rounds in shuffled order, "
                   f"{p.get('rep_ms')} ms of timed calls per tool, inputs refreshed in place from "
                   f"{p.get('rotating_sets')} sets and L2 flushed before every call, CUDA events around the call "
                   "alone (a host clock on CPU). Cells: median ± IQR. Inductor max-autotune runs as "
                   "`mode=\"max-autotune-no-cudagraphs\"` (no tool gets CUDA graphs).")
        out.append("")
    notes: list[str] = []
    header = ["workload", "shape", *tools, "floor", "kernelsmith vs best peer", "kernelsmith % of floor",
              "best peer % of floor"]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for w in r.workloads:
        best = w.best_peer()
        cells = [w.name, w.shape, *[_cell(w, t, notes) for t in tools], fmt_ms(w.floor_ms),
                 _ratio(w.ratio_to_best_peer()) + (f" ({best[0]})" if best and w.ratio_to_best_peer() else ""),
                 _pct(w.fraction_of_floor(KERNELSMITH)),
                 (f"{_pct(w.fraction_of_floor(best[0]))} ({best[0]})" if best else "–")]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    out.append("")
    if r.suite == "kernelbench" and r.summary:
        out += _kernelbench_summary(r.summary)
    if plot_names:
        for label, name in plot_names.items():
            out.append(f"![{label}]({name})")
            out.append("")
    out.append("Per workload, kernelsmith against the best peer and the roofline floor:")
    out.append("")
    out += closing_note(r)
    out.append("")
    if notes:
        out.append("Failures:")
        out.append("")
        out += [f"{i + 1}. {n}" for i, n in enumerate(notes)]
        out.append("")
    return "\n".join(out)


def _kernelbench_summary(s: dict[str, Any]) -> list[str]:
    out = ["| scope | baseline | n | kernelsmith correct | fast_1 | fast_1.05 | fast_1.5 | fast_2 | geomean speedup |",
           "|---|---|---|---|---|---|---|---|---|"]
    scopes = [("all", s.get("all") or {})] + [(f"level {k}", v) for k, v in (s.get("levels") or {}).items()]
    for scope, block in scopes:
        for base in ("eager", "inductor"):
            b = block.get(f"vs_{base}") or {}
            fp = b.get("fast_p") or {}
            gm = b.get("geomean_speedup")
            out.append(f"| {scope} | {base} | {b.get('n', 0)} | {b.get('correct', 0)} | "
                       + " | ".join(_pct(fp.get(k)) for k in ("1", "1.05", "1.5", "2"))
                       + f" | {_ratio(gm)} |")
    ind = (s.get("all") or {}).get("inductor_vs_eager_geomean")
    out += ["", f"Inductor over eager, geometric mean over the problems both ran: {_ratio(ind)}.", ""]
    return out


def render_table(r: RunResult) -> Table:
    tools = tool_columns(r)
    t = Table(title=f"{r.suite} on {r.env.get('device_name', '?')}" + (" (smoke)" if r.smoke else ""))
    for col in ["workload", *tools, "floor", "ks vs best", "ks % floor"]:
        t.add_column(col)
    for w in r.workloads:
        cells = []
        for tool in tools:
            x = w.tools.get(tool)
            cells.append("" if x is None else fmt_ms(x.median_ms) if x.ok else x.status)
        t.add_row(w.name, *cells, fmt_ms(w.floor_ms), _ratio(w.ratio_to_best_peer()),
                  _pct(w.fraction_of_floor(KERNELSMITH)))
    return t


# ----------------------------------------------------------------------------------------------- plots


def _bars(ax: Any, labels: list[str], series: dict[str, list[float | None]], base: float = 0.0) -> None:
    """Grouped bars drawn from ``base`` (1.0 for speedups: slower goes down, faster goes up)."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, vals) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j, v in enumerate(vals) if v is not None]
        ys = [v - base for v in vals if v is not None]
        ax.bar(xs, ys, width=width, bottom=base, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)


def plot_speedups(r: RunResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [w.name for w in r.workloads]
    peers = [t for t in tool_columns(r) if t != KERNELSMITH]
    series = {f"vs {p}": [(w.speedups[p].ratio if p in w.speedups else None) for w in r.workloads] for p in peers}
    fig, ax = plt.subplots(figsize=(max(8.0, 0.55 * len(labels) * max(len(peers), 1) / 2), 5))
    if any(v is not None for vals in series.values() for v in vals):
        _bars(ax, labels, series, base=1.0)
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no kernelsmith timings in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    for j, w in enumerate(r.workloads):
        ks = w.tools.get(KERNELSMITH)
        if ks is None or ks.status != OK:
            # x in data units, y in axes units: the label sits at the bottom whatever the scale.
            ax.text(j, 0.02, "no kernel" if ks is None or ks.status == NO_KERNEL else ks.status,
                    transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom", fontsize=7,
                    color="gray")
    ax.set_ylabel("kernelsmith speedup (peer time / kernelsmith time)")
    ax.set_title(f"{r.suite}: kernelsmith vs each peer, {r.env.get('device_name', '?')}"
                 + (" (SMOKE)" if r.smoke else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_floor_fractions(r: RunResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [w.name for w in r.workloads]
    tools = tool_columns(r)
    series = {t: [w.fraction_of_floor(t) for w in r.workloads] for t in tools}
    fig, ax = plt.subplots(figsize=(max(8.0, 0.55 * len(labels) * max(len(tools), 1) / 2), 5))
    if any(v is not None for vals in series.values() for v in vals):
        _bars(ax, labels, series)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0, 1.1)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no roofline floor (ceilings not measured)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("fraction of the roofline floor (floor / time)")
    ax.set_title(f"{r.suite}: fraction of the roofline floor, {r.env.get('device_name', '?')}"
                 + (" (SMOKE)" if r.smoke else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(r: RunResult, json_path: str | Path, plots: bool = True) -> list[Path]:
    """Write the markdown (and the plots) next to ``json_path``, as ``json_path`` with the suffix ``.md`` (the
    plots: ``-speedup.png``, ``-roofline.png`` after its stem); returns the files written."""
    json_path = Path(json_path)
    stem = json_path.with_suffix("")
    written = []
    plot_names: dict[str, str] = {}
    if plots and r.workloads:
        sp = plot_speedups(r, Path(f"{stem}-speedup.png"))
        fl = plot_floor_fractions(r, Path(f"{stem}-roofline.png"))
        written += [sp, fl]
        plot_names = {"kernelsmith speedup per workload against each peer": sp.name,
                      "fraction of the roofline floor per tool": fl.name}
    md = Path(f"{stem}.md")
    md.write_text(render_markdown(r, plot_names) + "\n")
    written.insert(0, md)
    return written


def build_parser(prog: str = "python -m benchmarks.report") -> argparse.ArgumentParser:
    from ks_inductor.cli.args import HelpFormatter, add_verbose_argument

    ap = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                                 description="Print the markdown table of a benchmark result, or write it and its "
                                             "plots with -o")
    ap.add_argument("result", type=Path, help="a result JSON written by python -m benchmarks.run")
    ap.add_argument("-o", "--output", type=Path, default=None, metavar="FILE.md",
                    help="write the markdown here, and the plots beside it (default: print the markdown, write "
                         "nothing)")
    ap.add_argument("--no-plots", action="store_true", help="with -o: the markdown alone")
    add_verbose_argument(ap)
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.report") -> int:
    """``prog``: the command line the help names this program by (``kernelsmith report``)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr)
    return handle(args)


def handle(args: argparse.Namespace) -> int:
    from ks_inductor.cli.output import err_console

    console = err_console()
    try:
        r = load_result(args.result)
    except (FileNotFoundError, ValueError) as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    if args.output is None:
        sys.stdout.write(render_markdown(r) + "\n")
        return 0
    if args.output.suffix != ".md":
        console.print(f"[red]error:[/] -o {args.output}: the markdown file's name ends in .md")
        return 2
    for p in write_report(r, args.output, plots=not args.no_plots):
        console.print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
