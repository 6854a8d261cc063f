"""What `import torchmon` imports, and the names it imports on first use
(docs/performance.md, "`import torchmon`"). How long it takes is shown by
benches/bench_import_time.py, not asserted here."""

from __future__ import annotations

import json

from support import run_python

# The modules that made `import torchmon` slow, none of which it needs at once
# (json too: checked apart, as these children import it to report).
_DEFERRED = (
    "inspect",
    "re",
    "socket",
    "torchmon._rank",
    "torchmon.handlers",
    "traceback",
    "typing",
)


def _imported_after(code: str) -> list[str]:
    result = run_python(
        f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n",
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_import_torchmon_leaves_the_slow_modules_for_later() -> None:
    # Against what a bare interpreter imports anyway.
    bare = set(_imported_after("pass"))
    after = set(_imported_after("import torchmon"))
    loaded_by_torchmon = sorted(m for m in _DEFERRED if m in after - bare)
    assert loaded_by_torchmon == []
    result = run_python(
        "import sys, torchmon\n"
        "print(sorted(m for m in ('json', 're', 'inspect') if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_sinks_are_imported_on_first_use_and_are_the_handlers_ones() -> None:
    result = run_python(
        """
        import sys
        import torchmon
        assert "torchmon.handlers" not in sys.modules
        names = ["JsonlEventHandler", "OpenTelemetryEventHandler",
                 "PrometheusEventHandler", "TensorboardEventHandler", "read_jsonl"]
        assert all(name in dir(torchmon) for name in names + ["handlers"])
        from torchmon import JsonlEventHandler
        import torchmon.handlers as handlers
        assert torchmon.handlers is handlers
        assert JsonlEventHandler is handlers.JsonlEventHandler
        assert all(getattr(torchmon, name) is getattr(handlers, name) for name in names)
        star = {}
        exec("from torchmon import *", star)
        assert all(star[name] is getattr(handlers, name) for name in names)
        try:
            torchmon.no_such_name
        except AttributeError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module 'torchmon' has no attribute 'no_such_name'"


def test_guard_imports_inspect_when_it_first_decorates() -> None:
    result = run_python(
        """
        import sys
        import torchmon
        counter = torchmon.WaitCounter("import_cost.guard")
        with counter.guard():
            pass
        assert "inspect" not in sys.modules
        @counter.guard()
        def step():
            return 1
        assert step() == 1 and "inspect" in sys.modules
        """
    )
    assert result.returncode == 0, result.stderr
