"""The one format of an argument error, shared with the native module
(``arg_message`` in src/py_convert.rs): the call, the argument, then the
argument again as the subject of the problem, e.g.
``WaitCounter(window_size): window_size must be finite, got nan``
(docs/api.md)."""

from __future__ import annotations


def arg_message(call: str, arg: str, problem: str) -> str:
    return f"{call}({arg}): {arg} {problem}"


def arg_type_error(call: str, arg: str, expected: str, got: object) -> TypeError:
    """``{call}({arg}): {arg} must be {expected}, not {type of got}``."""
    return TypeError(arg_message(call, arg, f"must be {expected}, not {type(got).__name__}"))


def arg_value_error(call: str, arg: str, problem: str) -> ValueError:
    """``{call}({arg}): {arg} {problem}``."""
    return ValueError(arg_message(call, arg, problem))
