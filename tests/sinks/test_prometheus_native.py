"""PrometheusEventHandler's protobuf exposition (docs/sinks.md, "Native
histograms"): decoded by protobuf's own runtime (tests/prometheus_proto.py),
every distribution one native histogram whose buckets are checked against
the samples with the schema's bucket bounds computed here; the Accept
negotiation, the bucket limit, the classic buckets for migration, close()
during scrapes and a forked child."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime
from fractions import Fraction
from typing import Any

import pytest
from dist_samples import from_samples
from prometheus_proto import METRIC_TYPES, bucket_counts, decode_delimited

from torchmon import STAT_EVENT, Event, PrometheusEventHandler

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

# What Prometheus 2.42 with --enable-feature=native-histograms sends.
PROMETHEUS_ACCEPT = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
ZERO_THRESHOLD = 2.0**-128


class WindowEvent:
    """A Stat window event carrying the distribution of ``samples`` (a
    Python-made torchmon.Event has no distribution)."""

    name = STAT_EVENT

    def __init__(self, stat: str, samples: list[float]) -> None:
        self.timestamp = datetime(2026, 1, 1)
        self.data = {f"{stat}.count": float(len(samples))}
        self.distribution = from_samples(samples)


def handler(**options: Any) -> PrometheusEventHandler:
    return PrometheusEventHandler(registry=CollectorRegistry(), **options)


def families(sink: PrometheusEventHandler) -> dict[str, Any]:
    rendered = sink.render(PROMETHEUS_ACCEPT)
    assert rendered is not None
    content_type, body = rendered
    assert content_type.startswith("application/vnd.google.protobuf")
    return {family.name: family for family in decode_delimited(body)}


def expected_key(x: float, schema: int) -> int:
    """The native-histogram bucket of |x| at ``schema``: the k with
    b**(k-1) < |x| <= b**k, b = 2**(2**-schema), in exact rationals (a
    logarithm guesses, the comparisons decide)."""
    magnitude = Fraction(abs(x))

    def at_most_bound(key: int) -> bool:  # |x| <= b**key
        if schema >= 0:  # |x|**(2**schema) <= 2**key
            return magnitude ** (2**schema) <= Fraction(2) ** key
        return magnitude <= Fraction(2) ** (key * 2**-schema)

    guess = math.ceil(math.log2(abs(x)) * 2.0**schema)
    for key in range(guess - 2, guess + 3):
        if at_most_bound(key) and not at_most_bound(key - 1):
            return key
    raise AssertionError(f"no key found for {x!r} at schema {schema}")


def native_counts(samples: list[float], schema: int) -> tuple[Counter[int], Counter[int], int]:
    positive: Counter[int] = Counter()
    negative: Counter[int] = Counter()
    zero = 0
    for x in samples:
        if abs(x) <= ZERO_THRESHOLD:
            zero += 1
        elif x > 0:
            positive[expected_key(x, schema)] += 1
        else:
            negative[expected_key(x, schema)] += 1
    return positive, negative, zero


def test_a_distribution_is_one_native_histogram_with_exact_negative_buckets() -> None:
    sink = handler(labels={"rank": "3"})
    rewards = [-5.0, -3.0, -1.0, 0.0, 2.0]
    sink(WindowEvent("reward", rewards))
    sink(WindowEvent("reward", [-0.25, 1e-300, -7.5]))
    found = families(sink)
    family = found["reward_histogram"]
    assert family.type == METRIC_TYPES["HISTOGRAM"]
    (metric,) = family.metric
    assert [(pair.name, pair.value) for pair in metric.label] == [("rank", "3")]
    h = metric.histogram
    everything = [*rewards, -0.25, 1e-300, -7.5]
    assert h.schema == 6
    assert h.zero_threshold == ZERO_THRESHOLD
    assert h.sample_count == len(everything)
    assert h.sample_sum == sum(everything)
    positive, negative, zero = native_counts(everything, 6)
    assert h.zero_count == zero == 2  # 0.0 and 1e-300
    assert bucket_counts(h.positive_span, h.positive_delta) == positive
    assert bucket_counts(h.negative_span, h.negative_delta) == negative
    # Four of the eight samples are negative, and say so.
    assert sum(negative.values()) == 5
    assert not h.bucket  # no classic buckets unless asked for
    # The gauges come along, with the same labels.
    gauge = found["reward_count"]
    assert gauge.type == METRIC_TYPES["GAUGE"]
    assert gauge.metric[0].gauge.value == 3.0
    sink.close()


def test_a_histogram_states_when_its_counts_started() -> None:
    """created_timestamp (docs/sinks.md, "Prometheus 3"): when the histogram
    was declared, its first window's arrival, the same at every later scrape;
    a gauge has none (the Gauge message has no such field)."""
    sink = handler()
    before = time.time()
    sink(WindowEvent("lat", [1.0, 2.0]))
    after = time.time()
    first = families(sink)["lat_histogram"].metric[0].histogram
    assert first.HasField("created_timestamp")
    created = first.created_timestamp.seconds + first.created_timestamp.nanos / 1e9
    assert before - 1e-6 <= created <= after + 1e-6, (before, created, after)
    time.sleep(0.01)
    sink(WindowEvent("lat", [3.0]))
    again = families(sink)["lat_histogram"].metric[0].histogram
    assert again.sample_count == 3
    assert again.created_timestamp == first.created_timestamp
    assert not families(sink)["lat_count"].metric[0].HasField("histogram")
    sink.close()


def test_an_empty_body_and_a_gauge_of_zero() -> None:
    sink = handler()
    assert families(sink) == {}
    sink(Event(STAT_EVENT, datetime.now(), {"a.sum": 0.0}))
    (family,) = families(sink).values()
    assert family.metric[0].HasField("gauge") and family.metric[0].gauge.value == 0.0
    sink.close()


def test_a_text_scraper_gets_the_classic_exposition_unchanged() -> None:
    sink = handler(labels={"rank": "0"})
    sink(WindowEvent("step", [0.01, 0.02, -1.0]))
    for accept in (None, "", "text/plain;version=0.0.4", "application/json", "*/*"):
        rendered = sink.render(accept)
        assert rendered is not None
        content_type, body = rendered
        assert content_type.startswith("text/plain")
        assert body == generate_latest(sink.registry)
    content_type, body = sink.render("application/openmetrics-text; version=1.0.0") or ("", b"")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    sink.close()


@pytest.mark.parametrize(
    ("accept", "protobuf"),
    [
        (PROMETHEUS_ACCEPT, True),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited", True),
        # Another encoding or message of the same media type is not ours.
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=text", False),
        ("application/vnd.google.protobuf;proto=other.Message;encoding=delimited", False),
        # Preferred below a text format, or refused.
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0.2,text/plain;q=0.5", False),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0", False),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=oops", False),
        ("garbage;;;=,,", False),
    ],
)  # fmt: skip
def test_accept_negotiation(accept: str, protobuf: bool) -> None:
    sink = handler()
    rendered = sink.render(accept)
    assert rendered is not None
    assert rendered[0].startswith("application/vnd.google.protobuf") is protobuf
    sink.close()


def test_the_bucket_limit_halves_the_resolution_until_the_buckets_fit() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(0, 3) * rng.choice((1, -1)) for _ in range(3000)]
    sink = handler(native_histogram_max_buckets=40)
    sink(WindowEvent("spread", samples))
    h = families(sink)["spread_histogram"].metric[0].histogram
    positive = bucket_counts(h.positive_span, h.positive_delta)
    negative = bucket_counts(h.negative_span, h.negative_delta)
    assert len(positive) + len(negative) <= 40
    assert h.schema < 6
    # The counts are those of the coarser schema, exactly.
    assert (Counter(positive), Counter(negative), h.zero_count) == native_counts(samples, h.schema)
    # One schema finer would not have fit.
    finer_positive, finer_negative, _ = native_counts(samples, h.schema + 1)
    assert len(finer_positive) + len(finer_negative) > 40
    sink.close()


def test_classic_buckets_in_the_protobuf_body_when_asked_for() -> None:
    sink = handler(protobuf_classic_buckets=True, histogram_buckets_per_octave=1)
    samples = [-2.0, 0.0, 0.3, 0.5, 1.5, 3.0, 1e9]
    sink(WindowEvent("mig", samples))
    h = families(sink)["mig_histogram"].metric[0].histogram
    assert h.schema == 6 and h.sample_count == len(samples)
    bounds = [(b.upper_bound, b.cumulative_count) for b in h.bucket]
    # One bound per octave from 2**-20 to 2**20 after le=0.0 (docs/sinks.md);
    # each cumulative count is the samples <= le, counted here.
    assert [le for le, _ in bounds] == [0.0] + [2.0**e for e in range(-20, 21)]
    assert [count for _, count in bounds] == [
        sum(1 for x in samples if x <= le) for le, _ in bounds
    ]
    sink.close()


# The one format of an argument error (python/torchmon/_errors.py).
_MAX_BUCKETS = r"\(native_histogram_max_buckets\): native_histogram_max_buckets must"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"native_histogram_max_buckets": 0},
            ValueError,
            _MAX_BUCKETS + " be >= 1, got 0",
        ),
        (
            {"native_histogram_max_buckets": "8"},
            TypeError,
            _MAX_BUCKETS + " be an int",
        ),
        (
            {"native_histogram_max_buckets": True},
            TypeError,
            _MAX_BUCKETS + " be an int",
        ),
        (
            {"protobuf_classic_buckets": 1},
            TypeError,
            r"\): protobuf_classic_buckets must be a bool",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        handler(**options)


def scrape(port: int, accept: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        # Closed here: CPython 3.14 warns (ResourceWarning) about an HTTPError
        # whose response is left to the garbage collector.
        try:
            return int(error.code), bytes(error.read())
        finally:
            error.close()


def test_serve_negotiates_and_a_scrape_during_close_is_whole_or_503() -> None:
    sink = PrometheusEventHandler.serve(port_base=0, labels={"rank": "0"})
    port = sink.port
    assert port is not None
    for index in range(200):
        sink(WindowEvent(f"s{index}", [float(index), -float(index), 0.5]))
    status, body = scrape(port, PROMETHEUS_ACCEPT)
    assert status == 200 and len(decode_delimited(body)) == 400
    status, text = scrape(port, "text/plain")
    assert status == 200 and text.startswith(b"# HELP")
    outcomes: list[object] = []

    def keep_scraping() -> None:
        while True:
            try:
                status, body = scrape(port, PROMETHEUS_ACCEPT)
            except OSError as exc:  # the server stopped
                outcomes.append(type(exc).__name__)
                return
            if status == 200:
                outcomes.append(len(decode_delimited(body)))  # raises if torn
            else:
                outcomes.append(status)

    scrapers = [threading.Thread(target=keep_scraping) for _ in range(3)]
    for thread in scrapers:
        thread.start()
    while len(outcomes) < 6:
        threading.Event().wait(0.01)
    sink.close()
    for thread in scrapers:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert set(outcomes) <= {400, 503, "URLError", "ConnectionResetError", "RemoteDisconnected"}
    assert 400 in outcomes


def test_render_after_close_is_none_and_the_app_answers_503() -> None:
    sink = handler()
    app = sink.wsgi_app()
    sink.close()
    assert sink.render(PROMETHEUS_ACCEPT) is None
    assert sink.render("text/plain") is None
    statuses: list[str] = []
    body = app(
        {"REQUEST_METHOD": "GET", "HTTP_ACCEPT": PROMETHEUS_ACCEPT},
        lambda status, headers: statuses.append(status),
    )
    assert statuses == ["503 Service Unavailable"] and b"closed" in b"".join(body)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_an_empty_native_state_and_can_use_it() -> None:
    """In a child process (it forks), with a timeout: the child's handler
    renders none of the parent's samples, in the protobuf body and in its
    registry's text alike, and counts its own windows."""
    code = textwrap.dedent(
        """
        import os, sys
        sys.path[:0] = sys.argv[1:]
        from datetime import timedelta
        import prometheus_client, torchmon
        from prometheus_proto import decode_delimited
        sink = torchmon.PrometheusEventHandler(registry=prometheus_client.CollectorRegistry())
        torchmon.register_event_handler(sink)
        stat = torchmon.Stat("x", [torchmon.Aggregation.P50], timedelta(hours=1))
        stat.add_many([1.0, 2.0])
        del stat
        accept = (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
            "encoding=delimited"
        )
        def count():
            body = sink.render(accept)[1]
            return {
                f.name: f.metric[0].histogram.sample_count
                for f in decode_delimited(body)
                if f.metric[0].HasField("histogram")
            }
        assert count()["x_histogram"] == 2, count()
        pid = os.fork()
        if pid == 0:
            ok = count() == {"x_histogram": 0}
            # The registry reads the same state: one state, not a copy per format.
            registry_text = prometheus_client.generate_latest(sink.registry).decode()
            ok = ok and "x_histogram_count 0.0" in registry_text
            child = torchmon.Stat("x", [torchmon.Aggregation.P50], timedelta(hours=1))
            child.add(3.0)
            del child
            ok = ok and count()["x_histogram"] == 1
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert count()["x_histogram"] == 2
        print("ok")
        """
    )
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code, tests_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("classic", [(7, 1.0, 2.0), (4, 2.0, 1.0), (4, 1.0, math.inf)])
def test_the_core_state_refuses_a_classic_layout_it_cannot_render(
    classic: tuple[int, float, float],
) -> None:
    from torchmon._core import _PrometheusExposition

    with pytest.raises(ValueError, match=r"_PrometheusExposition\(classic\)"):
        _PrometheusExposition([], 160, classic)
