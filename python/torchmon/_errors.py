"""The one format of an argument error, shared with the native module
(``arg_message`` in src/py_convert.rs): the call, the argument, then the
argument again as the subject of the problem, e.g.
``WaitCounter(key): key must be a str, not int`` (docs/api.md). Every
argument error of the package is made here: tests/api/test_error_format.py
fails on a hand-written ``raise TypeError("...")``/``raise ValueError(...)``."""

from __future__ import annotations

import sys
import types


def arg_message(call: str, arg: str, problem: str) -> str:
    return f"{call}({arg}): {arg} {problem}"


def arg_type_error(call: str, arg: str, expected: str, got: object) -> TypeError:
    """``{call}({arg}): {arg} must be {expected}, not {type of got}``."""
    return TypeError(arg_message(call, arg, f"must be {expected}, not {type(got).__name__}"))


def arg_value_error(call: str, arg: str, problem: str) -> ValueError:
    """``{call}({arg}): {arg} {problem}``."""
    return ValueError(arg_message(call, arg, problem))


def report_unraisable(exc: BaseException, obj: object, message: str) -> None:
    """Hands ``exc`` to ``sys.unraisablehook`` with ``message``; never raises
    (it runs where there is no caller to raise to: a handler's error while
    another exception propagates, a flush at a signal or at exit)."""
    try:
        hook = sys.unraisablehook
        if hook is sys.__unraisablehook__:
            # The default hook accepts only the interpreter's own argument
            # type, which Python code cannot create: print what it would.
            import traceback  # only here: `import torchmon` stays fast (docs/performance.md)

            print(f"{message}: {obj!r}", file=sys.stderr)
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        else:
            hook(
                types.SimpleNamespace(
                    exc_type=type(exc),
                    exc_value=exc,
                    exc_traceback=exc.__traceback__,
                    err_msg=message,
                    object=obj,
                )
            )
    except BaseException:
        pass  # nothing is left to report to
