"""The reference model must reproduce every public torch 2.13 conformance vector.

The vectors and their checker (replay.py) live outside the repository, in the
``shared/`` folder next to the checkout (``<checkout>/../shared``).  When that
folder is absent the whole module is skipped.
"""

import gc
import importlib.util
import json
from pathlib import Path

import pytest

from . import model

SHARED = Path(__file__).resolve().parents[3] / "shared"
CONFORMANCE = SHARED / "conformance"
REPLAY = CONFORMANCE / "replay.py"
VECTORS = CONFORMANCE / "torch-2.13-vectors.jsonl"

if not (REPLAY.is_file() and VECTORS.is_file()):
    pytest.skip(
        f"conformance vectors not available: need {REPLAY} and {VECTORS}",
        allow_module_level=True,
    )


def _load_replay():
    spec = importlib.util.spec_from_file_location("torchmon_conformance_replay", REPLAY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


replay = _load_replay()

with VECTORS.open(encoding="utf-8") as f:
    SCENARIOS = [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module", autouse=True)
def _cheap_gc():
    """Every "del" op runs gc.collect(); leave the objects that already exist
    (pytest's own included) out of those collections, as replay.py's main()
    does, and hand them back to the collector afterwards."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _real_clock():
    """The vectors' windows are >= 100 hours long; run them on the real clock."""
    model.set_clock_ms(None)
    yield
    model.set_clock_ms(None)


def test_vectors_present():
    assert len(SCENARIOS) == 400


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[sc["id"] for sc in SCENARIOS])
def test_model_matches_torch_vector(scenario):
    got = replay.run_scenario(model, scenario)
    i = replay.first_mismatch(scenario["expect"], got, strict_zero=True)
    if i is not None:
        op = scenario["ops"][i] if i < len(scenario["ops"]) else None
        expected = scenario["expect"][i] if i < len(scenario["expect"]) else None
        actual = got[i] if i < len(got) else None
        pytest.fail(
            f"op #{i}: {replay.dumps(op)}\n"
            f"expected: {replay.dumps(expected)}\n"
            f"got:      {replay.dumps(actual)}"
        )
    assert not model._registry, "the scenario left handlers registered"
