"""``kernelsmith``: the parser of every command and ``main``, which runs one and turns the user's mistakes into one
line and exit code 2."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from ks_inductor.cli import bench, cache, eval, evolve, explain, pack, report, trajectories, warm
from ks_inductor.cli.args import EXIT_USAGE, HelpFormatter, UsageError, add_verbose_argument
from ks_inductor.cli.output import check_db_folder, err_console, fail, print_error

# One module per command, in the order ``kernelsmith --help`` lists them.
COMMANDS = (eval, evolve, warm, explain, cache, pack, trajectories, bench, report)


class Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line on stderr (what is wrong, and where to read more)."""

    def error(self, message: str) -> NoReturn:
        print_error(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from ks_inductor import __version__

    parser = Parser(prog="kernelsmith", description="Evolve, verify, cache and serve Triton kernels",
                    formatter_class=HelpFormatter,
                    epilog="exit codes: 0 done, 1 the job ran and found nothing (no kernel, rejected, refused), "
                           "2 a usage error")
    parser.add_argument("--version", action="version", version=f"kernelsmith {__version__}",
                        help="print the version and exit")
    add_verbose_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def _user_error(e: BaseException) -> bool:
    """Whether ``e`` is about the user's input (a file, a URL, a factory, a machine without the asked backend)
    rather than a fault of kernelsmith: those get one line and exit code 2, not a traceback."""
    from kernel_cache.errors import CacheError
    from ks_core.problem_record import ProblemError
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.warm import WarmError

    return isinstance(e, (UsageError, CacheError, BackendUnavailable, ProblemError, WarmError))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (2), or --help and --version (0)
        return int(e.code or 0)
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    func: Any = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        check_db_folder(args)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        err_console().print("[yellow]interrupted[/]")
        return 130
    except Exception as e:
        if not _user_error(e):
            raise
        return fail(args, e, EXIT_USAGE)
