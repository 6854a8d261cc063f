"""`dir(torchmon)` is the public API (docs/api.md): `__all__`, `__version__`
and `handlers`, never a module torchmon imports for itself."""

from __future__ import annotations

import types

import torchmon

# Underscored names that are public: torch.monitor's own.
_TORCH_PRIVATE_NAMES = {"_WaitCounter", "_WaitCounterTracker"}


def test_dir_is_all_plus_the_version_and_handlers() -> None:
    assert dir(torchmon) == sorted({*torchmon.__all__, "__version__", "handlers"})


def test_no_module_torchmon_uses_internally_is_listed() -> None:
    listed = set(dir(torchmon))
    assert not listed & {"os", "atexit", "threading", "_core", "_flush", "TYPE_CHECKING"}
    for name in listed:
        value = getattr(torchmon, name)
        if isinstance(value, types.ModuleType):
            assert name == "handlers", f"dir(torchmon) lists the module {name!r}"
        if name.startswith("_") and not name.startswith("__"):
            assert name in _TORCH_PRIVATE_NAMES, f"dir(torchmon) lists the private {name!r}"


def test_every_listed_name_resolves_and_star_import_takes_all() -> None:
    for name in dir(torchmon):
        getattr(torchmon, name)
    namespace: dict[str, object] = {}
    exec("from torchmon import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(torchmon.__all__)
