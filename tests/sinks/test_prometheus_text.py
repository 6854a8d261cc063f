"""PrometheusEventHandler's text exposition rendered in Rust from the core
state (docs/sinks.md, "Native histograms", and docs/internals.md): byte for
byte prometheus_client's ``generate_latest`` of the handler's registry, for
gauges over many values (its ``floatToGoString``: ``1e-05``, ``+Inf``,
``NaN``, ``3.0``, Go's exponents above a million), histograms of many
distributions, labels and help texts that need escaping; and a
``serve()`` handler's text scrape that never calls into prometheus_client."""

from __future__ import annotations

import math
import random
import struct
from datetime import datetime
from typing import Any

import pytest
from dist_samples import from_samples

from torchmon import STAT_EVENT, Event, PrometheusEventHandler

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

TEXT_ACCEPT = "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"


class WindowEvent:
    """A Stat window event carrying the distribution of ``samples``."""

    name = STAT_EVENT

    def __init__(self, stat: str, samples: list[float]) -> None:
        self.timestamp = datetime(2026, 1, 1)
        self.data = {f"{stat}.count": float(len(samples))}
        self.distribution = from_samples(samples)


def many_floats(count: int, seed: int) -> list[float]:
    """Doubles from every part of the range: random bit patterns (so every
    exponent, subnormals included), integers around the Go switch at 1e6,
    powers of ten at Python's repr switches (1e-4/1e-5, 1e15/1e16), and the
    specials."""
    rng = random.Random(seed)
    values = [
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        math.nan,
        3.0,
        1e-5,
        1e-4,
        1e15,
        1e16,
        1e6,
        999999.0,
        1234567.0,
        1234567.5,
        -1234567.0,
        5e-324,
        1.7976931348623157e308,
        0.1,
        2.0**53,
        2.0**53 + 2,
    ]
    for exponent in range(-30, 30):
        values += [10.0**exponent, -(10.0**exponent), 1.5 * 10.0**exponent]
    for _ in range(count):
        (x,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        values.append(x)
        values.append(float(rng.randrange(10**12)))
        values.append(rng.uniform(-1e7, 1e7))
        values.append(round(rng.lognormvariate(0.0, 6.0), rng.randrange(12)))
    return values


def handler(**options: Any) -> PrometheusEventHandler:
    return PrometheusEventHandler(registry=CollectorRegistry(), **options)


def assert_same_text(sink: PrometheusEventHandler) -> str:
    core = sink._native.render(protobuf=False)
    assert core is not None
    expected = generate_latest(sink.registry)
    if core != expected:  # the first differing line, not 100 KB of bytes
        pairs = zip(core.decode().splitlines(), expected.decode().splitlines())
        first = next(((a, b) for a, b in pairs if a != b), None)
        raise AssertionError(f"core text differs from prometheus_client's: {first!r}")
    return core.decode()


@pytest.mark.parametrize("seed", [0, 1])
def test_gauges_over_many_values_match_prometheus_client(seed: int) -> None:
    sink = handler(labels={"rank": "3", "job": "pre\\train"})
    values = many_floats(1500, seed)
    sink(Event(STAT_EVENT, datetime.now(), {f"v{i}.mean": x for i, x in enumerate(values)}))
    text = assert_same_text(sink)
    assert len(text.splitlines()) == 3 * len(values)
    # Set again: the gauges keep the last window's values.
    rng = random.Random(seed + 100)
    rng.shuffle(values)
    sink(Event(STAT_EVENT, datetime.now(), {f"v{i}.mean": x for i, x in enumerate(values)}))
    assert_same_text(sink)


def test_histograms_of_many_distributions_match_prometheus_client() -> None:
    rng = random.Random(7)
    for per_octave in (1, 4, 64):
        sink = handler(
            labels={"rank": "0", "job": "user's", "a": 'q"uote\nnl'},
            histogram_buckets_per_octave=per_octave,
            histogram_range=(1e-3, 1e4),
        )
        for stat in range(20):
            for _ in range(3):
                samples = [rng.lognormvariate(0.0, 5.0) * rng.choice((1, 1, -1)) for _ in range(50)]
                samples += rng.choice(([], [0.0], [math.inf], [-math.inf], [math.nan], [1e300]))
                sink(WindowEvent(f"layer{stat}.grad-norm", samples))
        text = assert_same_text(sink)
        assert 'le="+Inf"' in text and "layer19_grad_norm_histogram_sum" in text


def test_help_texts_and_metric_order_match_prometheus_client() -> None:
    sink = handler(prefix="job:")
    sink(Event(STAT_EVENT, datetime.now(), {"back\\slash.new\nline.max": 1.0}))
    sink(WindowEvent("dist", [1.0, 2.0]))
    sink(Event(STAT_EVENT, datetime.now(), {"z.sum": 2, "a.min": -7}))
    text = assert_same_text(sink)
    assert text.index("job:z_sum") < text.index("job:a_min")


def test_a_name_clash_leaves_the_core_text_equal_to_the_registry() -> None:
    sink = handler()
    sink(WindowEvent("x", [1.0]))
    with pytest.raises(ValueError, match="x_histogram_count"):
        # The gauge name is the histogram's _count: the registry refuses it.
        sink(Event(STAT_EVENT, datetime.now(), {"x_histogram.count": 1.0}))
    assert_same_text(sink)


def test_a_served_text_scrape_does_not_call_prometheus_client() -> None:
    sink = PrometheusEventHandler.serve(port_base=0, labels={"rank": "0"})
    try:
        sink(WindowEvent("loss", [0.5, 1.5]))
        expected = generate_latest(sink.registry)

        def refuse() -> None:
            raise AssertionError("the text scrape collected the registry in Python")

        sink.registry.collect = refuse  # type: ignore[method-assign]
        rendered = sink.render(TEXT_ACCEPT)
        assert rendered == ("text/plain; version=0.0.4; charset=utf-8", expected)
    finally:
        sink.close()


def test_a_handler_on_a_registry_of_its_users_renders_that_registry() -> None:
    # Other collectors in it are served too: prometheus_client's path.
    registry = CollectorRegistry()
    prometheus_client.Gauge("other_metric", "someone else's", registry=registry).set(4.0)
    sink = PrometheusEventHandler(registry=registry)
    sink(Event(STAT_EVENT, datetime.now(), {"a.sum": 2.0}))
    rendered = sink.render(TEXT_ACCEPT)
    assert rendered is not None
    assert b"other_metric 4.0" in rendered[1] and b"a_sum 2.0" in rendered[1]
