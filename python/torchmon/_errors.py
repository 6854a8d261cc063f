"""The one format of an argument error, shared with the native module
(``arg_message`` in src/py_convert.rs): the call, the argument, then the
argument again as the subject of the problem, e.g.
``WaitCounter(key): key must be a str, not int`` (docs/api.md). Every
argument error of the package is made here: tests/api/test_error_format.py
fails on a hand-written ``raise TypeError("...")``/``raise ValueError(...)``."""

from __future__ import annotations

import math
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


def _shown(value: object) -> str:
    try:
        return repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return "an int too long to show"


def check_int(
    call: str,
    arg: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    expected: str = "an int",
) -> int:
    """An int argument (``bool`` refused) within ``low..high``, ends included:
    ``must be >= {low}, got {value}`` (``<=``, or ``in {low}..{high}`` when
    both ends bound it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise arg_type_error(call, arg, expected, value)
    below = low is not None and value < low
    above = high is not None and value > high
    if below or above:
        if low is not None and high is not None:
            bound = f"in {low}..{high}"
        else:
            bound = f">= {low}" if below else f"<= {high}"
        raise arg_value_error(call, arg, f"must be {bound}, got {_shown(value)}")
    return value


def check_seconds(
    call: str,
    arg: str,
    value: object,
    *,
    zero: bool = False,
    finite: bool = False,
    expected: str = "a number of seconds",
) -> float:
    """A number of seconds (an int or a float, ``bool`` refused): above 0
    (``zero``: from 0), NaN refused and, when ``finite``, the infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise arg_type_error(call, arg, expected, value)
    try:
        seconds = float(value)
    except OverflowError:  # an int past the float range
        seconds = math.inf if value > 0 else -math.inf
    if not (seconds >= 0.0 if zero else seconds > 0.0) or (finite and math.isinf(seconds)):
        bound = (">= 0 seconds" if zero else "> 0 seconds") + (" and finite" if finite else "")
        raise arg_value_error(call, arg, f"must be {bound}, got {_shown(value)}")
    return seconds


def check_optional_seconds(
    call: str, arg: str, value: object, *, zero: bool = False, finite: bool = False
) -> float | None:
    """``check_seconds``, with ``None`` passed through."""
    if value is None:
        return None
    expected = "a number of seconds or None"
    return check_seconds(call, arg, value, zero=zero, finite=finite, expected=expected)


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
