"""docs/internals.md's module map names every module of the three layers, and
says what each uses: a module added, moved or removed without its row, or a
use added or dropped without its cell, fails here. Run from a
checkout only (the docs and the Rust sources are not in the wheel)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "internals.md"


def _rows(section: str, text: str | None = None) -> str:
    if text is None:
        text = MAP.read_text(encoding="utf-8")
    start = text.index(section)
    end = text.index("\n### ", start + 1) if "\n### " in text[start + 1 :] else len(text)
    return "\n".join(line for line in text[start:end].splitlines() if line.startswith("| "))


def _named(rows: str, name: str) -> bool:
    return re.search(r"`" + re.escape(name) + r"[`(/ ]", rows) is not None


@pytest.fixture(autouse=True)
def _checkout() -> None:
    if not MAP.is_file() or not (REPO / "src").is_dir():
        pytest.skip("not run from a checkout")


def test_every_core_module_has_a_row() -> None:
    rows = _rows("### `crates/torchmon-core`")
    core = REPO / "crates" / "torchmon-core" / "src"
    names = []
    for path in sorted(core.rglob("*.rs")):
        relative = path.relative_to(core)
        if relative.name == "lib.rs":
            continue
        if len(relative.parts) == 1:
            names.append(relative.stem)  # `clock`
        else:
            names.append(relative.as_posix())  # `stat/mod.rs`
    assert [name for name in names if not _named(rows, name)] == []


def test_every_binding_module_has_a_row() -> None:
    rows = _rows("### `src/`")
    names = [path.name for path in sorted((REPO / "src").glob("*.rs"))]
    assert [name for name in names if not _named(rows, name)] == []


def test_every_package_module_has_a_row() -> None:
    rows = _rows("### `python/torchmon/`")
    package = REPO / "python" / "torchmon"
    names = [path.name for path in sorted(package.glob("*.py"))]
    names += [path.name + "/" for path in sorted(package.iterdir()) if path.is_dir()]
    names = [name for name in names if name not in ("__pycache__/", "__main__.py")]
    assert [name for name in names if not _named(rows, name)] == []


# The "uses" column: each row's backticked names outside parentheses are
# the modules of the same layer (or, for the binding, of the core) that the
# module uses; what it really imports must be exactly those. Names in
# parentheses explain and are not compared; unquoted names are outside
# crates (parking_lot, libc).


def _cells(section: str, text: str | None = None) -> list[list[str]]:
    return [
        [cell.strip() for cell in row.strip().strip("|").split(" | ")]
        for row in _rows(section, text).splitlines()
        if not row.startswith(("| ---", "| module"))
    ]


def _listed(cell: str) -> set[str]:
    depth, outside = 0, []
    for char in cell:
        depth += char == "("
        if depth == 0:
            outside.append(char)
        depth -= char == ")" and depth > 0
    return {re.split(r"[/:.]", name)[0] for name in re.findall(r"`([^`]+)`", "".join(outside))}


def _rust_uses(path: Path, crate: str) -> set[str]:
    """The top-level modules of `crate` named in `path`, outside comments
    and its trailing `#[cfg(test)] mod`."""
    source = re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8"))
    source = re.split(r"#\[cfg\(test\)\]\s*mod ", source)[0]
    names = set(re.findall(rf"\b{crate}::(\w+)", source))
    for group in re.findall(rf"\b{crate}::\{{([^}}]*)\}}", source):
        names |= {part.strip().split("::")[0] for part in group.split(",") if part.strip()}
    return names


def _python_uses(path: Path, package: Path) -> set[str]:
    """The package's top-level modules that `path` imports relatively."""
    source = path.read_text(encoding="utf-8")
    folder = list(path.relative_to(package).parts[:-1])
    names = set()
    for dots, module, what in re.findall(
        r"^\s*from (\.+)([\w.]*) import ([^\n(]+|\([^)]*\))", source, re.M
    ):
        up = len(dots) - 1
        base = folder[: len(folder) - up] if up else folder
        parts = base + [part for part in module.split(".") if part]
        if parts:
            names.add(parts[0])
        else:
            names |= {word for word in re.findall(r"\w+", what) if word != "as"}
    return names


def core_mismatches(text: str | None = None) -> list[str]:
    """The core's rows whose uses cell differs from the module's `use crate::`
    lines (in `text`, the map as written, by default docs/internals.md)."""
    core = REPO / "crates" / "torchmon-core" / "src"
    wrong = []
    for cells in _cells("### `crates/torchmon-core`", text):
        name = cells[0].strip("`")
        path = core / (name if name.endswith(".rs") else f"{name}.rs")
        if not path.is_file():
            continue
        own = path.relative_to(core).parts[0].removesuffix(".rs")
        used = _rust_uses(path, "crate") - {own}
        listed = _listed(cells[-1]) - {own}
        if used != listed:
            wrong.append(f"{name}: uses {sorted(used)}, the map says {sorted(listed)}")
    return wrong


def test_each_core_modules_uses_are_what_it_uses() -> None:
    assert core_mismatches() == []


def test_each_binding_modules_core_uses_are_what_it_uses() -> None:
    wrong = []
    for cells in _cells("### `src/`"):
        name = cells[0].strip("`")
        used = _rust_uses(REPO / "src" / name, "torchmon_core")
        if used != _listed(cells[-1]):
            wrong.append(f"{name}: uses {sorted(used)}, the map says {sorted(_listed(cells[-1]))}")
    assert wrong == []


def test_each_package_modules_imports_are_what_it_imports() -> None:
    package = REPO / "python" / "torchmon"
    wrong = []
    for cells in _cells("### `python/torchmon/`"):
        name = cells[0].split("`")[1]
        if name.endswith("/"):
            own, files = name.rstrip("/"), sorted((package / name).rglob("*.py"))
        else:
            own, files = name.removesuffix(".py"), [package / name]
        used = set().union(*(_python_uses(file, package) for file in files)) - {own}
        listed = {n.removesuffix(".py") for n in _listed(cells[-1])} - {own}
        if used != listed:
            wrong.append(f"{name}: imports {sorted(used)}, the map says {sorted(listed)}")
    assert wrong == []


def test_a_wrong_uses_cell_is_caught() -> None:
    text = MAP.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `watchdog/sections.rs`"))
    wrong_row = row[: row.rindex(" | ")] + " | `clock`, `worker`, parking_lot |"
    assert core_mismatches(text.replace(row, wrong_row)) == [
        "watchdog/sections.rs: uses ['clock'], the map says ['clock', 'worker']"
    ]
