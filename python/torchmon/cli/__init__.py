"""The ``torchmon`` command (also ``python -m torchmon``).

    torchmon demo [--logdir DIR] [--epochs N] [--steps N] [--seed S]
    torchmon summarize FILE.jsonl [--strict]
    torchmon to-tensorboard FILE.jsonl LOGDIR [--step-field FIELD] [--layout L] [--append]
    torchmon --version

See docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Callable, TextIO

from . import demo, summarize, to_tensorboard
from ._common import _EXIT_ERROR, _EXIT_INTERRUPTED, _EXIT_USAGE, _CliError, _printable

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="torchmon",
        description="torchmon: torch.monitor's Stat/Event API, standalone. Tools for its logs.",
    )
    parser.add_argument("--version", action="version", version=f"torchmon {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo.add_parser(commands)
    summarize.add_parser(commands)
    to_tensorboard.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``torchmon`` command line; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else _EXIT_USAGE
    out, err = sys.stdout, sys.stderr
    run: Callable[[argparse.Namespace, TextIO, TextIO], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(err)
        return _EXIT_USAGE
    try:
        return run(args, out, err)
    except _CliError as exc:
        # The message may quote the input: a path, a line, a key.
        print(_printable(f"torchmon {args.command}: {exc}"), file=err)
        return exc.code
    except KeyboardInterrupt:  # Ctrl-C while reading a slow pipe, a long log
        print(f"torchmon {args.command}: interrupted", file=err)
        return _EXIT_INTERRUPTED
    except BrokenPipeError:  # `torchmon summarize x.jsonl | head`
        # Python would report the pipe again when it flushes stdout at exit.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return _EXIT_ERROR
