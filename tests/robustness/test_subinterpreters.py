"""torchmon refuses to be imported in a subinterpreter (docs/reliability.md).

Its state is process-wide: one handler registry, one set of live Stats, one
exit gate and set of exit hooks, and Python objects that belong to the
interpreter that made them. Imported in a subinterpreter, `Stat.add` hung
there, the subinterpreter's end closed the exit gate for the main
interpreter, and a handler it left behind crashed the next `log_event`.
Each case runs in a child process with a timeout (the old failure was a
hang).
"""

from __future__ import annotations

import subprocess

import pytest
from support import run_python

MESSAGE = "torchmon cannot be imported in a subinterpreter"
ERROR_TAIL = (
    ": its state (the handler registry, the live Stats, the exit hooks) is process-wide"
    " and belongs to the main interpreter; import and use torchmon there"
)

# Runs `source` in a new subinterpreter, by whichever of CPython's private
# modules this version has; prints which one was used. The legacy
# `_testcapi.run_in_subinterp` shares the main interpreter's GIL (the kind
# that let the import through); `_xxsubinterpreters` / `_interpreters` make
# one that is destroyed explicitly.
HELPERS = r'''
import importlib, sys

def run_legacy(source):
    import _testcapi
    return _testcapi.run_in_subinterp(source)

def run_created(source):
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            interpreters = importlib.import_module(name)
        except ImportError:
            continue
        # One that shares the main GIL: with its own, CPython itself refuses
        # any module that does not declare support for that.
        if name == "_interpreters":  # 3.13+
            interp = interpreters.create("legacy")
        elif sys.version_info >= (3, 12):
            interp = interpreters.create(isolated=False)
        else:
            interp = interpreters.create()
        run = getattr(interpreters, "run_string", None) or interpreters.exec
        try:
            run(interp, source)
        except Exception as exc:  # not expected: PROBE catches what it expects
            print("running raised", type(exc).__name__, exc, flush=True)
        interpreters.destroy(interp)
        return name
    return None

# What the subinterpreter runs: tries the import, reports how it ended.
PROBE = """
try:
    import torchmon
except ImportError as exc:
    print("sub: ImportError:", exc, flush=True)
else:
    print("sub: imported", flush=True)
    torchmon.Stat("sub", [torchmon.SUM], 60.0).add(1)
    print("sub: added", flush=True)
"""
# The same without the add, which hung: only what importing did.
IMPORT_ONLY = PROBE.split("    torchmon.Stat")[0]
'''

MAIN_WORKS = r"""
import datetime
import torchmon
got = []
handle = torchmon.register_event_handler(lambda event: got.append(event.name))
stat = torchmon.Stat("main", [torchmon.SUM], 60.0, 1)
stat.add(1)  # max_samples=1: emits to the handler
torchmon.log_event(torchmon.Event("e", datetime.datetime.now(), {}))
assert got == ["torch.monitor.Stat", "e"], got
assert torchmon._core._exit_gate_state()[0] is False, "exit gate closed"
print("main: works", flush=True)
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    try:
        return run_python(HELPERS + code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the child did not exit within 60 s (a subinterpreter hung)")


def sub_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("sub:")]


def has_testcapi() -> bool:
    return run_python("import _testcapi").returncode == 0


needs_testcapi = pytest.mark.skipif(
    not has_testcapi(), reason="this CPython has no _testcapi module"
)


@needs_testcapi
@pytest.mark.parametrize("main_first", [True, False], ids=["main-first", "sub-first"])
def test_import_in_a_legacy_subinterpreter_is_refused(main_first: bool) -> None:
    """Whichever interpreter imports first: the subinterpreter gets an
    ImportError saying why, and the main interpreter keeps working (its
    exit gate open, its handlers called, a clean exit)."""
    first = "import torchmon\n" if main_first else ""
    proc = run(first + "run_legacy(PROBE)\n" + MAIN_WORKS)
    assert proc.returncode == 0, proc.stderr
    assert sub_lines(proc.stdout) == ["sub: ImportError: " + MESSAGE + ERROR_TAIL], proc.stdout
    assert "main: works" in proc.stdout


def test_a_destroyed_subinterpreter_leaves_torchmon_working_in_the_main_one() -> None:
    """Destroying a subinterpreter ran the exit hooks it had registered by
    importing torchmon, which closed the exit gate of the whole process and
    so silently stopped delivery in the main interpreter."""
    proc = run("import torchmon\nprint('used', run_created(IMPORT_ONLY))\n" + MAIN_WORKS)
    assert proc.returncode == 0, proc.stderr
    if "used None" in proc.stdout:
        pytest.skip("this CPython has neither _interpreters nor _xxsubinterpreters")
    assert sub_lines(proc.stdout) == ["sub: ImportError: " + MESSAGE + ERROR_TAIL], proc.stdout
    assert "main: works" in proc.stdout
