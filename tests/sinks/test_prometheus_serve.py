"""PrometheusEventHandler.serve(): one call per rank serving its own registry
on port_base + LOCAL_RANK, with rank labels (docs/api.md,
"`rank_info` and the per-rank sinks"). Real sockets on 127.0.0.1."""

from __future__ import annotations

import errno
import socket
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from support import clear_torchrun_env

import torchmon

pytest.importorskip("prometheus_client")


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Rank 5 of 8, local rank 1 of 4 on node 1, in job "j7"."""
    clear_torchrun_env(monkeypatch)
    for variable, value in {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "j7",
    }.items():
        monkeypatch.setenv(variable, value)
    return monkeypatch


def free_port_pair() -> int:
    """A port p such that p and p + 1 were both free a moment ago."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    pytest.fail("no two adjacent free ports on 127.0.0.1")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode("utf-8"))


def can_bind(port: int) -> bool:
    """Whether another server could listen on ``port`` now (with SO_REUSEADDR,
    as servers do, since the scrapes' connections linger in TIME_WAIT; Linux
    still refuses it while a socket listens there)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
        return True


@pytest.fixture
def handlers() -> Iterator[list[torchmon.PrometheusEventHandler]]:
    """Closes every handler a test made, even when it fails."""
    made: list[torchmon.PrometheusEventHandler] = []
    yield made
    for handler in made:
        handler.close()


def test_serves_on_port_base_plus_local_rank_with_rank_labels(
    rank_env: pytest.MonkeyPatch, handlers: list[torchmon.PrometheusEventHandler]
) -> None:
    base = free_port_pair()
    sink = torchmon.PrometheusEventHandler.serve(port_base=base, prefix="trainer_")
    handlers.append(sink)
    assert sink.port == base + 1
    handle = torchmon.register_event_handler(sink)
    try:
        stat = torchmon.Stat("serve.loss", [torchmon.MEAN], timedelta(seconds=60))
        stat.add(0.25)
        del stat  # emits its window
    finally:
        torchmon.unregister_event_handler(handle)
    text = scrape(base + 1)
    assert 'trainer_serve_loss_mean{job="j7",local_rank="1",node="1",rank="5"} 0.25' in text
    # Its own registry: none of the global registry's process collectors.
    assert "python_info" not in text and "process_" not in text


def test_close_stops_the_server_and_frees_the_port(
    rank_env: pytest.MonkeyPatch, handlers: list[torchmon.PrometheusEventHandler]
) -> None:
    base = free_port_pair()
    sink = torchmon.PrometheusEventHandler.serve(port_base=base)
    handlers.append(sink)
    port = base + 1
    assert not can_bind(port)
    scrape(port)
    sink.close()
    assert sink.port is None
    assert can_bind(port)
    with pytest.raises(OSError):
        scrape(port)
    sink.close()  # idempotent
    # The port can be served again at once.
    again = torchmon.PrometheusEventHandler.serve(port_base=base)
    handlers.append(again)
    assert again.port == port


def test_a_taken_port_is_a_one_line_error_naming_it(
    rank_env: pytest.MonkeyPatch, handlers: list[torchmon.PrometheusEventHandler]
) -> None:
    base = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 1))
        squatter.listen()
        with pytest.raises(OSError) as excinfo:
            handlers.append(torchmon.PrometheusEventHandler.serve(port_base=base))
    assert excinfo.value.errno == errno.EADDRINUSE
    message = str(excinfo.value)
    assert "\n" not in message
    assert f"port {base + 1} on 127.0.0.1 is already in use" in message
    assert f"port_base {base} + LOCAL_RANK 1" in message


def test_handler_options_override_the_defaults(
    rank_env: pytest.MonkeyPatch, handlers: list[torchmon.PrometheusEventHandler]
) -> None:
    import prometheus_client

    registry = prometheus_client.CollectorRegistry()
    sink = torchmon.PrometheusEventHandler.serve(
        port_base=0, labels={"team": "x"}, registry=registry
    )
    handlers.append(sink)
    assert sink.registry is registry
    port = sink.port
    assert port is not None and port > 0
    sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 2.0}))
    assert 'a_sum{team="x"} 2.0' in scrape(port)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"port_base": "9400"},
            TypeError,
            r"\(port_base\): port_base must be an int, not str",
        ),
        ({"port_base": True}, TypeError, r"\(port_base\): port_base must be an int, not bool"),
        ({"port_base": 65535}, ValueError, r"65535 \+ LOCAL_RANK 1 = 65536 is not a port"),
        ({"port_base": -5}, ValueError, r"serve\(port_base\): port_base -5"),
        ({"host": 1}, TypeError, r"serve\(host\): host must be a str, not int"),
        ({"prefix": "1x"}, ValueError, r"PrometheusEventHandler\(prefix\)"),
    ],
)
def test_bad_arguments_are_named(
    rank_env: pytest.MonkeyPatch, kwargs: dict[str, object], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        torchmon.PrometheusEventHandler.serve(**kwargs)  # type: ignore[arg-type]


def test_a_handler_made_by_the_constructor_serves_nothing() -> None:
    import prometheus_client

    sink = torchmon.PrometheusEventHandler(registry=prometheus_client.CollectorRegistry())
    assert sink.port is None
    sink.close()


TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROTOBUF_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)


@pytest.mark.parametrize(
    ("escaping", "name", "stated"),
    [
        # What Prometheus 3 asks for by default: the key's own characters.
        ("allow-utf-8", b'{"serve.loss.mean",job="j7"', "; escaping=allow-utf-8"),
        ("underscores", b'serve_loss_mean{job="j7"', "; escaping=underscores"),
        ("dots", b'serve_dot_loss_dot_mean{job="j7"', "; escaping=dots"),
        ("values", b'U__serve_2e_loss_2e_mean{job="j7"', "; escaping=values"),
        # A scheme nobody defines: ignored, the names Prometheus 2 gets.
        ("bogus", b'serve_loss_mean{job="j7"', ""),
    ],
)
def test_names_follow_the_escaping_the_scraper_asks_for(
    rank_env: pytest.MonkeyPatch,
    handlers: list[torchmon.PrometheusEventHandler],
    escaping: str,
    name: bytes,
    stated: str,
) -> None:
    """Prometheus 3 names an escaping scheme in its Accept header; torchmon
    follows it as client_golang does, and its Content-Type states the scheme
    used (docs/sinks.md, "Prometheus 3"): always a 200 with a body the
    scraper parses."""
    sink = torchmon.PrometheusEventHandler.serve(port_base=free_port_pair())
    handlers.append(sink)
    handle = torchmon.register_event_handler(sink)
    try:
        stat = torchmon.Stat("serve.loss", [torchmon.MEAN], timedelta(seconds=60))
        stat.add(0.5)
        del stat
    finally:
        torchmon.unregister_event_handler(handle)

    def get(accept: str) -> tuple[str, bytes]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{sink.port}/metrics", headers={"Accept": accept}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            return str(response.headers["Content-Type"]), response.read()

    content_type, body = get(
        f"application/openmetrics-text;version=1.0.0;escaping={escaping};q=0.6,"
        f"text/plain;version=1.0.0;escaping={escaping};q=0.4,text/plain;version=0.0.4;q=0.3"
    )
    assert content_type == TEXT_TYPE + stated
    assert name in body, body
    # render() negotiates the same way.
    assert sink.render(f"text/plain;escaping={escaping}") == (content_type, body)
    content_type, body = get(
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
        f"encoding=delimited;escaping={escaping};q=0.6,text/plain;version=0.0.4;q=0.2"
    )
    assert content_type == PROTOBUF_TYPE + stated
    # The protobuf MetricFamily's name field: the name without the labels.
    quoted = name.startswith(b"{")
    bare = name[1:].split(b",")[0].strip(b'"') if quoted else name.split(b"{")[0]
    assert b"\n" + bytes([len(bare)]) + bare + b"\x12" in body, body
