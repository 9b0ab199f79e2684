"""The README's command lines run as written, and the tracked files hold no work log.

Every line of a fenced code block in README.md that starts with ``kernelsmith`` is parsed by the real command-line
parser (in this process: argparse alone, a few milliseconds each), once as written, which catches unknown flags and
missing arguments, and once with ``--help`` appended, which must exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_commands(text: str) -> list[str]:
    """The ``kernelsmith ...`` lines of the fenced code blocks, without their trailing ``# comments``."""
    commands, fenced = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            stripped = stripped.removeprefix("$ ")
            if stripped.startswith("kernelsmith ") or stripped == "kernelsmith":
                commands.append(re.sub(r"\s+#.*$", "", stripped))
    return commands


COMMANDS = readme_commands(README.read_text())


def _program_parser(command: str) -> argparse.ArgumentParser | None:
    """``kernelsmith bench`` and ``kernelsmith report`` hand their arguments to the repository's benchmark programs:
    those programs' parsers, which the command lines must also satisfy."""
    if command == "bench":
        from benchmarks.run import add_arguments

        p = argparse.ArgumentParser(prog="python -m benchmarks.run")
        add_arguments(p)
        return p
    if command == "report":
        from benchmarks.report import build_parser

        return build_parser()
    return None


def _parse(argv: list[str]) -> int:
    """Exit status of the kernelsmith parser on ``argv`` (0 when it parses and would run), output swallowed; for
    the commands that run a benchmark program, of that program's parser too."""
    from ks_inductor.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            build_parser().parse_args(argv)
            program = _program_parser(argv[0]) if argv else None
            if program is not None:
                program.parse_args(argv[1:])
        except SystemExit as e:
            return 0 if e.code is None else (e.code if isinstance(e.code, int) else 1)
    return 0


def test_the_readme_shows_commands_for_every_subcommand() -> None:
    from ks_inductor.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    shown = {shlex.split(c)[1] for c in COMMANDS if len(shlex.split(c)) > 1}
    assert set(sub.choices) <= shown, f"README shows no command line for {sorted(set(sub.choices) - shown)}"


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses_as_written(command: str) -> None:
    argv = shlex.split(command)[1:]
    assert _parse(argv) == 0, f"`{command}` is refused by the parser"
    assert _parse(argv + ["--help"]) == 0, f"`{command} --help` does not exit 0"


def test_no_work_log_in_tracked_files() -> None:
    """README, docs, code, comments, tests and file names describe what kernelsmith is and does, not the numbered
    work periods in which it was made."""
    git = shutil.which("git")
    if git is None or subprocess.run([git, "-C", str(ROOT), "rev-parse", "--git-dir"],
                                     capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    pattern = "session ?[0-9]+"
    content = subprocess.run([git, "-C", str(ROOT), "grep", "-niE", pattern], capture_output=True, text=True)
    assert content.returncode == 1, f"work-log wording in tracked files:\n{content.stdout[:4000]}"
    names = subprocess.run([git, "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
    hits = [n for n in names.splitlines() if re.search(pattern, n, re.IGNORECASE)]
    assert not hits, f"work-log file names: {hits[:20]}"
