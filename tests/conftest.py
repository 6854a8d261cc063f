"""Shared fixtures; hypothesis profiles chosen by TORCHMON_HYPOTHESIS_PROFILE."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support import SHARED

import torchmon

# ci: the fixed-seed run CI always does; ci-random: the same size, random seed;
# ci-light: CI's run on the Pythons besides 3.11 (.ci/pythons), fixed seed: the
# properties are the Rust core's and the reference model's, the same on every
# interpreter, and 3.11 searches them at full size twice;
# deep: a long hunt for counterexamples (see README, "Development").
# deep-part: one of the seeded 2,000-example parts of .ci/deep-conformance.
_LONG_RUN = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=500, derandomize=True, **_LONG_RUN)
settings.register_profile("ci-random", max_examples=500, **_LONG_RUN)
settings.register_profile("ci-light", max_examples=100, derandomize=True, **_LONG_RUN)
settings.register_profile("deep", max_examples=20_000, **_LONG_RUN)
settings.register_profile("deep-part", max_examples=2_000, **_LONG_RUN)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("TORCHMON_HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def shared_dir() -> Path:
    if not (SHARED / "conformance").is_dir():
        pytest.skip(
            f"{SHARED} (the shared conformance folder) is absent: "
            "TORCHMON_SHARED=/path/to/shared names it"
        )
    return SHARED


class Recorder:
    """A registered handler that keeps every event it receives."""

    def __init__(self) -> None:
        self.events: list[torchmon.Event] = []

    def __call__(self, event: torchmon.Event) -> None:
        self.events.append(event)

    @property
    def stat_data(self) -> list[dict[str, object]]:
        return [e.data for e in self.events if e.name == torchmon.STAT_EVENT]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    # A Stat an earlier test left in a reference cycle emits its open window
    # when collected: collected here, not into this test's recorder.
    gc.collect()
    rec = Recorder()
    handle = torchmon.register_event_handler(rec)
    try:
        yield rec
    finally:
        torchmon.unregister_event_handler(handle)


@pytest.fixture(autouse=True)
def no_leftover_handlers() -> Iterator[None]:
    """Each test leaves the global registry as it found it."""
    before = torchmon._core._handler_count()
    yield
    assert torchmon._core._handler_count() == before, "a test left a handler registered"
