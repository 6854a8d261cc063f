"""PrometheusEventHandler against the real prometheus_client: Stat windows
driven through the registry, scraped over HTTP from prometheus_client's own
server and parsed with its own parser."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from support import registered

import torchmon
from torchmon import Aggregation, Event, PrometheusEventHandler, Stat
from torchmon.handlers._common import stat_description
from torchmon.handlers.prometheus import prometheus_metric_name
from torchmon.testing import ManualClock

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

Samples = dict[str, list[tuple[dict[str, str], float]]]


@contextmanager
def http_server(registry: CollectorRegistry) -> Iterator[str]:
    """prometheus_client's exporter on 127.0.0.1 (ephemeral port); yields the URL."""
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def scrape(url: str) -> Samples:
    """Every sample of a scrape, by metric family: [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
    }


def window(stat: Stat, clock: ManualClock, *values: float) -> None:
    """Adds values in the current window, then moves to the next one."""
    for v in values:
        stat.add(v)
    clock.advance(1000)


def test_stat_windows_scraped_over_http() -> None:
    registry = CollectorRegistry()
    labels = {"rank": "0", "job": "pretrain"}
    with PrometheusEventHandler(registry=registry, labels=labels) as sink:
        with registered(sink), http_server(registry) as url, ManualClock(0) as clock:
            loss = Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT], 1.0)
            assert scrape(url) == {}  # no window closed yet: no gauge
            window(loss, clock, 1.0, 2.0, 6.0)
            loss.add(0.5)  # closes the first window
            assert scrape(url) == {
                "train_loss_mean": [(labels, 3.0)],
                "train_loss_max": [(labels, 6.0)],
                "train_loss_count": [(labels, 3.0)],
            }
            clock.advance(1000)
            loss.add(0.25)  # closes the second: the gauges show the last window
            got = scrape(url)
            assert got["train_loss_mean"] == [(labels, 0.5)]
            assert got["train_loss_count"] == [(labels, 1.0)]
            del loss  # the destruction flush emits the third
            gc.collect()
            assert scrape(url)["train_loss_max"] == [(labels, 0.25)]


def test_prefix_no_labels_and_sanitised_names() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, prefix="myjob_") as sink:
        with registered(sink), http_server(registry) as url, ManualClock(0) as clock:
            odd = Stat("0 grad-norm/é", [Aggregation.SUM, Aggregation.MIN], 1.0)
            window(odd, clock, 1.5, -2.0)
            del odd
            gc.collect()
            assert scrape(url) == {
                "myjob_0_grad_norm___sum": [({}, -0.5)],
                "myjob_0_grad_norm___min": [({}, -2.0)],
            }


def test_metric_name_rules() -> None:
    assert prometheus_metric_name("train.loss.mean") == "train_loss_mean"
    assert prometheus_metric_name("a:b_c.max") == "a:b_c_max"
    assert prometheus_metric_name("0loss.mean") == "_0loss_mean"
    assert prometheus_metric_name("élan vital.sum") == "_lan_vital_sum"
    assert prometheus_metric_name("") == "_"
    assert prometheus_metric_name("0x.sum", prefix="p_") == "p_0x_sum"
    # names the server accepts and its parser reads back
    registry = CollectorRegistry()
    key = "9 \x00\u2028é.mean"
    with PrometheusEventHandler(registry=registry) as sink:
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {key: 1.0}))
        text = prometheus_client.generate_latest(registry).decode()
    (family,) = text_string_to_metric_families(text)
    assert family.name == prometheus_metric_name(key) == "_9_____mean"


def test_non_finite_values() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink, registered(sink):
        with http_server(registry) as url, ManualClock(0) as clock:
            s = Stat("x", [Aggregation.SUM, Aggregation.MAX, Aggregation.MIN], 1.0)
            window(s, clock, math.inf, -math.inf)
            s.add(0.0)
            got = scrape(url)
            del s
            gc.collect()
    assert math.isnan(got["x_sum"][0][1])
    assert got["x_max"] == [({}, math.inf)]
    assert got["x_min"] == [({}, -math.inf)]


def test_other_events_and_non_numbers_are_ignored() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink, registered(sink):
        torchmon.log_event(Event("train.epoch_end", datetime.now(), {"loss": 0.5, "epoch": 3}))
        torchmon.log_event(
            Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 2, "s": "text", "b": True})
        )
        text = prometheus_client.generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert list(families) == ["a_sum"]
    assert families["a_sum"].samples[0].value == 2.0


def test_default_registry_is_prometheus_clients_default() -> None:
    sink = PrometheusEventHandler()
    try:
        assert sink.registry is prometheus_client.REGISTRY
    finally:
        sink.close()
    registry = CollectorRegistry()
    assert PrometheusEventHandler(registry=registry).registry is registry


def test_two_keys_with_one_name() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        event = Event(torchmon.STAT_EVENT, datetime.now(), {"a.b.sum": 1.0, "a_b.sum": 2.0, "c": 3})
        with pytest.raises(ValueError, match=r"'a\.b\.sum' and 'a_b\.sum' both map to .*'a_b_sum'"):
            sink(event)
        # the other keys were still set, and the first owner keeps its value
        assert registry.get_sample_value("a_b_sum") == 1.0
        assert registry.get_sample_value("c") == 3.0


def test_name_taken_by_another_handler_until_it_closes() -> None:
    registry = CollectorRegistry()
    event = Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": 1.0})
    first = PrometheusEventHandler(registry=registry, labels={"rank": "0"})
    second = PrometheusEventHandler(registry=registry, labels={"rank": "1"})
    try:
        first(event)
        with pytest.raises(ValueError, match="cannot create the gauge 'loss_mean'"):
            second(event)
        first.close()
        assert registry.get_sample_value("loss_mean", {"rank": "0"}) is None
        second(Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": 2.0}))
        assert registry.get_sample_value("loss_mean", {"rank": "1"}) == 2.0
    finally:
        first.close()
        second.close()
    assert registry.get_sample_value("loss_mean", {"rank": "1"}) is None


def test_the_registry_holds_one_collector_and_renders_as_prometheus_clients_gauges() -> None:
    """The handler's state is its native exposition only (docs/sinks.md,
    "Prometheus"): its registry holds one collector of the handler's, whose
    text and OpenMetrics output are those of prometheus_client's own
    labelled gauges holding the same values."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    labels = {"rank": "0", "job": 'pre"train'}
    values = {"loss.mean": 0.25, "loss.max": math.inf, "step.count": 1234567.0, "x": math.nan}
    registry = CollectorRegistry()
    before = set(registry._collector_to_names)
    with PrometheusEventHandler(registry=registry, labels=labels) as sink:
        sink(Event(torchmon.STAT_EVENT, datetime.now(), dict(values)))
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": -3.5}))
        assert len(set(registry._collector_to_names) - before) == 1
        expected = CollectorRegistry()
        for key, value in {**values, "loss.mean": -3.5}.items():
            gauge = prometheus_client.Gauge(
                prometheus_metric_name(key),
                stat_description(key),
                labelnames=list(labels),
                registry=expected,
            )
            gauge.labels(*labels.values()).set(value)
        for render in (prometheus_client.generate_latest, openmetrics):
            assert render(registry) == render(expected)


def test_a_name_the_handler_holds_is_refused_to_a_later_collector() -> None:
    """Names first seen in one event are held in the registry by the
    handler's collector from then on, a histogram's series names with it."""
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        with registered(sink):
            stat = Stat("lat", [Aggregation.P50], timedelta(hours=1))
            stat.add(1.0)
            del stat
        for name in ("lat_p50", "lat_histogram", "lat_histogram_count"):
            with pytest.raises(ValueError, match="Duplicated"):
                prometheus_client.Gauge(name, "someone else's", registry=registry)
        assert registry.get_sample_value("lat_histogram_count") == 1
    prometheus_client.Gauge("lat_histogram_count", "free once closed", registry=registry)


def test_a_name_taken_while_the_collector_is_registered_again_keeps_the_older_names() -> None:
    """docs/sinks.md, "One owner per name": another thread registering one
    of an event's new names between the two calls that register the
    handler's collector again gets it; the event raises ValueError, the
    collector keeps the names, and values, it held before, and the name
    taken is refused again to later events, as any name taken."""

    class Racing(CollectorRegistry):
        def unregister(self, collector: Any) -> None:
            super().unregister(collector)
            names = [family.name for family in collector.describe()]
            if names[:2] == ["a_sum", "b_sum"] and not taken:  # the second event's take-over
                taken.append(prometheus_client.Gauge("b_sum", "the racer's", registry=self))

    taken: list[Any] = []
    registry = Racing()
    with PrometheusEventHandler(registry=registry) as sink:
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
        with pytest.raises(ValueError, match="b_sum"):
            sink(Event(torchmon.STAT_EVENT, datetime.now(), {"b.sum": 2.0}))
        assert taken and registry.get_sample_value("a_sum") == 1.0
        # The racer's series only, not a second one from the handler.
        assert prometheus_client.generate_latest(registry).count(b"\nb_sum ") == 1
        with pytest.raises(ValueError, match="Duplicated"):
            prometheus_client.Gauge("a_sum", "held by the handler", registry=registry)
        with pytest.raises(ValueError, match="cannot create the gauge 'b_sum'"):
            sink(Event(torchmon.STAT_EVENT, datetime.now(), {"b.sum": 3.0}))
        assert registry.get_sample_value("b_sum") == 0.0


def test_closed_handler_raises() -> None:
    sink = PrometheusEventHandler(registry=CollectorRegistry())
    sink.close()
    sink.close()
    assert "closed" in repr(sink)
    with pytest.raises(ValueError, match="closed"):
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
    sink(Event("other", datetime.now(), {}))  # not a Stat event: nothing to do


def test_label_named_self() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, labels={"self": "a"}) as sink:
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"x.max": 4.0}))
        assert registry.get_sample_value("x_max", {"self": "a"}) == 4.0


def test_a_label_named_le_is_refused_and_one_named_quantile_is_not() -> None:
    """Prometheus reserves ``le`` for the bounds of histogram buckets (every
    histogram series would carry two); ``quantile`` is a summary's, and
    this handler exports none."""
    for options in ({}, {"histogram_buckets_per_octave": None}):
        with pytest.raises(
            ValueError,
            match=r"^PrometheusEventHandler\(labels\): labels has an invalid label name 'le' ",
        ):
            PrometheusEventHandler(registry=CollectorRegistry(), labels={"le": "1"}, **options)
    with pytest.raises(ValueError, match=r"PrometheusEventHandler\(labels\): .*'le'"):
        PrometheusEventHandler.serve(port_base=0, labels={"rank": "0", "le": "x"})
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, labels={"quantile": "q"}) as sink:
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"x.max": 4.0}))
        assert registry.get_sample_value("x_max", {"quantile": "q"}) == 4.0


def test_threads_share_gauges() -> None:
    """Several threads closing windows at once: one gauge per name, no error."""
    registry = CollectorRegistry()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(200):
                s = Stat(f"s{i % 10}", [Aggregation.SUM], timedelta(hours=1), max_samples=1)
                s.add(float(t))
        except BaseException as exc:
            errors.append(exc)

    with PrometheusEventHandler(registry=registry, labels={"rank": "3"}) as sink:
        with registered(sink):
            workers = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        assert errors == []
        text = prometheus_client.generate_latest(registry).decode()
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert sorted(families) == sorted(f"s{i}_sum" for i in range(10))
    for samples in families.values():
        (sample,) = samples
        assert sample.labels == {"rank": "3"} and sample.value in (0.0, 1.0, 2.0, 3.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"registry": object()}, TypeError, "registry"),
        ({"prefix": 1}, TypeError, "prefix"),
        ({"prefix": "1x_"}, ValueError, "prefix"),
        ({"prefix": "a.b"}, ValueError, "prefix"),
        ({"labels": [("rank", "0")]}, TypeError, "labels"),
        ({"labels": {1: "0"}}, TypeError, "labels"),
        ({"labels": {"0rank": "0"}}, ValueError, "labels"),
        ({"labels": {"a:b": "0"}}, ValueError, "labels"),
        ({"labels": {"__name": "0"}}, ValueError, "labels"),
        ({"labels": {"rank": 0}}, TypeError, "labels"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], argument: str) -> None:
    with pytest.raises(error, match=rf"PrometheusEventHandler\({argument}\)"):
        PrometheusEventHandler(**kwargs)


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        PrometheusEventHandler(CollectorRegistry())  # type: ignore[misc]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_torchmon_does_not_import_prometheus_client() -> None:
    result = run_python(
        "import sys, torchmon\n"
        "assert torchmon.PrometheusEventHandler\n"
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus', 'opentelemetry'))))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_missing_prometheus_client_names_the_extra() -> None:
    result = run_python(
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if not installed\n"
        "import torchmon\n"
        "try:\n"
        "    torchmon.PrometheusEventHandler()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    # a command that works: torchmon itself is on no package index (docs/sinks.md)
    assert "pip install prometheus-client" in result.stdout
    assert "torchmon[" not in result.stdout
