"""docs/internals.md's module map names every module of the three layers: a
module added, moved or removed without its row fails here. Run from a
checkout only (the docs and the Rust sources are not in the wheel)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "internals.md"


def _rows(section: str) -> str:
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
