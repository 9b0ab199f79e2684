"""The arguments the ``kernelsmith`` commands share, declared once: a flag has one spelling, one meaning, one unit
and one default in every command that takes it, and every number is checked as it is parsed (a one-line error and
exit code 2, never a traceback).

A command module builds its parser with :func:`command` (the help formatter that shows every default, and ``-v``)
and adds the flags it takes with the ``add_*`` functions below; it declares a flag of its own only where no other
command has it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ks_core.settings import Settings
from ks_inductor.warm.sources import KERNELBENCH_LEVELS


class UsageError(Exception):
    """A mistake in what the user typed or pointed at; ``main`` prints its message on one line and exits 2."""


# ---------------------------------------------------------------------------------------------- exit codes
# The same three everywhere, documented in the README: the job ran and did what was asked; the job ran and found
# nothing (no kernel, a rejected candidate, a refused pack); what was asked cannot be run as given.
EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2

# ---------------------------------------------------------------------------------------------- defaults
# One default for every command that searches: the backend's own (``kernelsmith.budget``), so that a warm, an evolve
# and a compile with ``on_miss="evolve"`` judge as many candidates per region unless told otherwise.
BUDGET = Settings().budget
ISLANDS = 2
SEED = 0
BATCH = 1
SEQ = 16

DB_HELP = ("kernel cache: a SQLAlchemy URL or a SQLite file path (default: $KERNELSMITH_DB, else kernels.db in "
           "$KERNELSMITH_HOME, else in ~/.cache/kernelsmith)")
BACKEND_HELP = "judge backend (default: detect; triton-cuda or triton-maca on a GPU, triton-interpret on CPU)"
JSON_HELP = "print one JSON document on stdout and nothing else there (progress and logs go to stderr)"
VERBOSE_HELP = "more log output on stderr: -v info, -vv debug (before or after the command)"


# ---------------------------------------------------------------------------------------------- numbers


def _number(kind: type, low: float, inclusive: bool) -> Callable[[str], Any]:
    """An argparse type: ``kind`` at or above ``low`` (above it when not ``inclusive``)."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got "
                                             f"{text!r}") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if v < low or (v == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'at least' if inclusive else 'more than'} {low:g}, got {text}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True)
positive_float = _number(float, 0, False)
nonnegative_int = _number(int, 0, True)
nonnegative_float = _number(float, 0, True)


def csv_of(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: a comma-separated list, each item parsed by ``kind``."""
    def parse(text: str) -> list[Any]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [kind(x) for x in items]

    parse.__name__ = "list"
    return parse


DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
DTYPES = ("bfloat16", "float16", "float32", "float64")


def dtype_name(text: str) -> str:
    """An argparse type: ``bf16``, ``bfloat16`` or ``torch.bfloat16`` → ``bfloat16`` (torch's name)."""
    key = text.strip().lower().removeprefix("torch.")
    name = DTYPE_ALIASES.get(key, key)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: use bf16, fp16, fp32 or a torch name "
                                         f"({', '.join(DTYPES)})")
    return name


# ---------------------------------------------------------------------------------------------- parsers


class HelpFormatter(argparse.HelpFormatter):
    """Shows the default of every option whose help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default in (None, False, [], argparse.SUPPRESS) or not action.option_strings
                or action.nargs == 0):
            return text
        if isinstance(default, (list, tuple)):
            default = ",".join(str(d) for d in default)
        return f"{text} (default {default})"


def command(sub: Any, name: str, helptext: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command's parser: every default in its help, and ``-v`` after the command as well as before it."""
    p = sub.add_parser(name, help=helptext, description=kwargs.pop("description", helptext[:1].upper() + helptext[1:]),
                       formatter_class=HelpFormatter, **kwargs)
    add_verbose_argument(p, sub_command=True)
    return p


def hidden_alias(p: argparse.ArgumentParser | Any, flag: str, dest: str, **kwargs: Any) -> None:
    """A spelling kept only because a command line in the README or a test may still use it: it parses into the
    same place as the flag it stands for and is left out of ``--help``."""
    p.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


# ---------------------------------------------------------------------------------------------- flags


def add_verbose_argument(p: argparse.ArgumentParser, sub_command: bool = False) -> None:
    # After a command it counts into a field of its own, added to the top-level count by main().
    p.add_argument("-v", "--verbose", action="count", dest="sub_verbose" if sub_command else "verbose",
                   default=argparse.SUPPRESS if sub_command else 0, help=VERBOSE_HELP)


def add_db_argument(p: argparse.ArgumentParser | Any) -> None:
    p.add_argument("--db", default=None, metavar="URL", help=DB_HELP)


def add_json_argument(p: argparse.ArgumentParser | Any) -> None:
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def add_backend_argument(p: argparse.ArgumentParser | Any) -> None:
    from ks_inductor.judge.backends import BACKEND_NAMES

    p.add_argument("--backend", choices=list(BACKEND_NAMES), default=None, help=BACKEND_HELP)


def add_key_argument(p: argparse.ArgumentParser | Any, what: str) -> None:
    p.add_argument("--key", action="append", dest="keys", default=None, metavar="KEY",
                   help=f"only {what} of this problem key; a prefix of one is enough (repeatable; default: all)")


def add_search_arguments(p: argparse.ArgumentParser | Any, per: str) -> None:
    """``--budget`` and ``--time-limit`` (both per ``per``: a problem, a region), ``--islands`` and ``--seed``."""
    p.add_argument("--budget", type=positive_int, default=BUDGET, metavar="N",
                   help=f"candidates judged per {per} (default {BUDGET}, as the backend's kernelsmith.budget)")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                   help=f"wall-time limit per {per}, in seconds (default: none)")
    p.add_argument("--islands", type=positive_int, default=ISLANDS, metavar="N",
                   help=f"independent populations the search keeps (default {ISLANDS})")
    p.add_argument("--seed", type=nonnegative_int, default=SEED, metavar="N",
                   help=f"random seed of the search (default {SEED})")
    p.add_argument("--settle-at", type=nonnegative_float, default=None, metavar="FRACTION",
                   help=f"no search for a {per} whose faster of eager and Inductor runs at this fraction of its floor "
                        "(bytes at the measured copy rate, FLOPs at the measured matmul rate) or above; the backend "
                        "serves that baseline (default 0.9 on a GPU; on the interpreter no room is measured unless "
                        "this is given)")


def add_model_arguments(p: argparse.ArgumentParser | Any, source: str | None) -> None:
    """What builds a model: ``source`` (a positional argument with this help, or none), or a transformers config
    with random weights, its overrides and the example inputs' shapes, dtype and device."""
    if source is not None:
        p.add_argument("source", nargs="?", help=source)
    p.add_argument("--hf-config", metavar="MODEL", default=None,
                   help="a transformers model type such as 'llama', or a config.json: the model is built with "
                        "random weights, nothing downloaded (needs transformers; default: none)")
    p.add_argument("--hf-set", metavar="KEY=VALUE", action="append", default=None,
                   help="with --hf-config: override a config field, e.g. --hf-set hidden_size=64 (repeatable; "
                        "default: none)")
    p.add_argument("--batch", type=positive_int, action="append", default=None, metavar="N",
                   help=f"with --hf-config: a batch size of the example input ids (repeatable: every --batch with "
                        f"every --seq; default {BATCH})")
    p.add_argument("--seq", type=positive_int, action="append", default=None, metavar="N",
                   help=f"with --hf-config: tokens per sequence of the example input ids, e.g. each prefill length "
                        f"and 1 for a decode step (repeatable; default {SEQ})")
    p.add_argument("--dtype", type=dtype_name, default=None, metavar="DTYPE",
                   help="with --hf-config: the model's dtype: bf16, fp16, fp32 or a torch name such as bfloat16 "
                        "(default: bf16 on a GPU, fp32 on a CPU)")
    p.add_argument("--device", default=None, help="with --hf-config: the model's device (default: cuda when "
                                                  "available, else cpu)")


def add_kernelbench_arguments(p: argparse.ArgumentParser | Any) -> None:
    """Where KernelBench problems come from, the same for ``warm`` and ``bench``."""
    levels = ",".join(str(n) for n in KERNELBENCH_LEVELS)
    p.add_argument("--kernelbench", metavar="DIR", default=None,
                   help="KernelBench problems: a KernelBench checkout (or its KernelBench/ folder, with level1/ "
                        "... in it) (default: none)")
    p.add_argument("--levels", type=csv_of(positive_int), default=None, metavar="N,N",
                   help=f"with --kernelbench: the levels to take from a checkout (default {levels})")
    p.add_argument("--problems", type=csv_of(positive_int), default=None, metavar="ID,ID",
                   help="with --kernelbench: only these problem ids, the number a file's name starts with "
                        "(default: all)")


def batches(args: argparse.Namespace) -> list[int]:
    return list(dict.fromkeys(args.batch or [BATCH]))


def seqs(args: argparse.Namespace) -> list[int]:
    return list(dict.fromkeys(args.seq or [SEQ]))
