"""Every argument error of the package is made by the constructors of the
one format (python/torchmon/_errors.py, `<call>(<arg>): <arg> <problem>`,
docs/api.md), not written by hand: this scan of python/torchmon fails on a
`raise TypeError(...)`/`raise ValueError(...)` whose message is a string
literal, an f-string or a formatted string, outside the modules listed
below."""

from __future__ import annotations

import ast
from pathlib import Path

import torchmon

PACKAGE = Path(torchmon.__file__).parent

# Modules whose hand-written TypeError/ValueError are not argument errors:
# the one format itself, and the command line, whose messages are its output
# to the user (docs/cli.md).
NOT_ARGUMENT_MODULES = ("_errors.py", "cli/", "__main__.py")

# Errors that are not about an argument (module, start of the message), each
# with its reason.
NOT_ARGUMENT_ERRORS = {
    # The state of the object, as a closed file's ValueError.
    ("_system.py", "SystemStats.start(): the sampler is closed"),
    ("_system.py", "SystemStats.sample_now(): the sampler is closed"),
    # What torchrun's environment holds (docs/api.md, rank_info), not an argument.
    ("_rank.py", "rank_info: environment variable"),
    # The state of the handler, as a closed file's ValueError.
    ("handlers/jsonl.py", "JsonlEventHandler({self._path!r}) is closed"),
    # What an event holds, found when it is handled (docs/sinks.md: the sinks
    # raise only for a closed sink, or two keys that map to one metric name).
    ("handlers/otel.py", "OpenTelemetryEventHandler: distributions of scale"),
    ("handlers/otel.py", "OpenTelemetryEventHandler: {both} both map"),
    ("handlers/prometheus.py", "PrometheusEventHandler: Stat keys"),
    ("handlers/prometheus.py", "PrometheusEventHandler: the histogram of Stat"),
    ("handlers/prometheus.py", "PrometheusEventHandler: cannot create the gauge"),
    ("handlers/prometheus.py", "PrometheusEventHandler: cannot create the histogram"),
    ("handlers/prometheus.py", "PrometheusEventHandler is closed"),
    # Where it is called from, not what it is given.
    ("_flush.py", "torchmon."),
}


def _hand_written(node: ast.expr) -> bool:
    """A message written in place: a literal, an f-string, a concatenation or
    `%` of one, or a literal's `.format(...)`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _hand_written(node.left) or _hand_written(node.right)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and _hand_written(node.func.value)
    )


def _message_start(node: ast.expr) -> str:
    """A hand-written message as written, its f-string fields included,
    without the quotes it starts with."""
    text = ast.unparse(node)
    return text.removeprefix("f")[1:]


def hand_written_argument_errors(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module.startswith(NOT_ARGUMENT_MODULES):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            if not (isinstance(func, ast.Name) and func.id in {"TypeError", "ValueError"}):
                continue
            if not (node.exc.args and _hand_written(node.exc.args[0])):
                continue
            start = _message_start(node.exc.args[0])
            if not any(
                module == allowed and start.startswith(prefix)
                for allowed, prefix in NOT_ARGUMENT_ERRORS
            ):
                found.append(f"{module}:{node.lineno}: {start[:60]!r}")
    return found


def test_argument_errors_use_the_one_format() -> None:
    found = hand_written_argument_errors()
    assert not found, (
        "hand-written argument errors (use arg_type_error/arg_value_error/arg_message "
        f"of torchmon._errors, or list an error that is not about an argument in "
        f"NOT_ARGUMENT_ERRORS, with its reason): {found}"
    )


def test_the_scan_finds_hand_written_messages(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def f(x, n):\n"
        "    raise TypeError(f'f(x): must be a str, not {type(x).__name__}')\n"
        "    raise ValueError('f(n): ' + str(n))\n"
        "    raise ValueError('f(n): {}'.format(n))\n"
        "    raise ValueError(arg_message('f', 'n', 'must be > 0'))\n"
        "    raise ValueError(message)\n"
        "    raise RuntimeError('not an argument error')\n",
        encoding="utf-8",
    )
    found = hand_written_argument_errors(tmp_path)
    assert [entry.split(":")[1] for entry in found] == ["2", "3", "4"]


def test_one_rule_for_ints_and_seconds() -> None:
    """The package's ints and numbers of seconds are checked by
    `_errors.check_int` / `check_seconds`: `bool` refused, the bounds and the
    value in the message, NaN and (when asked) the infinities refused."""
    import math

    import pytest

    from torchmon._errors import check_int, check_optional_seconds, check_seconds

    assert check_int("f", "n", 3, low=1, high=3) == 3
    with pytest.raises(TypeError, match=r"^f\(n\): n must be an int, not bool$"):
        check_int("f", "n", True, low=0)
    with pytest.raises(ValueError, match=r"^f\(n\): n must be >= 1, got 0$"):
        check_int("f", "n", 0, low=1)
    with pytest.raises(ValueError, match=r"^f\(n\): n must be <= 3, got 4$"):
        check_int("f", "n", 4, high=3)
    with pytest.raises(ValueError, match=r"^f\(n\): n must be in 1\.\.3, got 4$"):
        check_int("f", "n", 4, low=1, high=3)

    assert check_seconds("f", "t", 2) == 2.0 and isinstance(check_seconds("f", "t", 2), float)
    assert check_seconds("f", "t", 0, zero=True) == 0.0
    assert check_seconds("f", "t", math.inf) == math.inf
    assert check_optional_seconds("f", "t", None) is None
    with pytest.raises(TypeError, match=r"^f\(t\): t must be a number of seconds or None, not"):
        check_optional_seconds("f", "t", "1")
    with pytest.raises(TypeError, match=r"^f\(t\): t must be a number of seconds, not bool$"):
        check_seconds("f", "t", False)
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"^f\(t\): t must be > 0 seconds, got"):
            check_seconds("f", "t", bad)
    with pytest.raises(ValueError, match=r"^f\(t\): t must be >= 0 seconds, got -1$"):
        check_seconds("f", "t", -1, zero=True)
    for bad in (math.inf, 10**400):
        with pytest.raises(ValueError, match=r"^f\(t\): t must be > 0 seconds and finite, got"):
            check_seconds("f", "t", bad, finite=True)
    with pytest.raises(ValueError, match=r"must be > 0 seconds, got -1000"):
        check_seconds("f", "t", -(10**400))
    with pytest.raises(ValueError, match=r"^f\(n\): n must be <= 3, got an int too long to show$"):
        check_int("f", "n", 10**5000, high=3)
