"""The ``kernelsmith`` command's parser walked (every command, every flag), and its one-line errors read."""

from __future__ import annotations

import argparse

from ks_inductor.cli import build_parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for the top-level parser and every sub-command, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def actions(option: str):
    for path, p in commands(build_parser()):
        for a in p._actions:
            if option in a.option_strings:
                yield path, a


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err
