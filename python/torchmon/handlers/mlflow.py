"""MLflow sink: each closed Stat window becomes metrics of an MLflow run,
sent with ``log_batch`` from a background thread (needs ``pip install
'mlflow>=3,<3.18'``, the ``mlflow`` extra). See docs/sinks.md, "MLflow".

``mlflow`` is imported when a handler is created, never by ``import
torchmon``. The queue, the thread, the retries, ``flush()``, the exit and the
fork are :class:`torchmon.handlers._tracker.TrackerEventHandler`'s.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .._core import Event
from .._errors import arg_type_error, arg_value_error
from ._common import check_mapping, require, shortened
from ._tracker import DEFAULT_BATCH_SIZE, DEFAULT_MAX_QUEUE, Row, StepOption, TrackerEventHandler

__all__ = ["MLflowEventHandler", "mlflow_key"]

_OWNER = "MLflowEventHandler"

# MLflow's limits (mlflow.utils.validation): metrics per log_batch, tags per
# log_batch, key and tag value lengths.
MAX_METRICS_PER_BATCH = 1000
_MAX_TAGS_PER_BATCH = 100
_MAX_KEY = 250
_MAX_TAG_VALUE = 8000
#: Seconds at most that the constructor waits for the run it creates.
MAX_CONSTRUCTOR_WAIT = 5.0
# What MLflow accepts in a metric or tag name on POSIX (its own regex).
_INVALID_KEY_CHAR = re.compile(r"[^/\w.\- :]")


def mlflow_key(key: str) -> str:
    """The MLflow metric (or tag) name of a Stat key: ``"train.loss.mean"``
    stays as is.

    MLflow accepts letters, digits, ``_``, ``-``, ``.``, space, ``:`` and
    ``/`` (and no path that ``posixpath.normpath`` would change: ``a//b``,
    ``/a``, ``..``), at most 250 characters. Any other character becomes
    ``_``; a key that still is such a path has its ``/`` replaced too, and
    ``_`` put in front when it is empty or starts with ``..``. A key so
    renamed gets ``-`` and 8 hex digits of its SHA-256 before its last
    ``.<suffix>`` (the aggregation), so that ``loss,a`` and ``loss;a`` stay
    two metrics; a longer key keeps its start, the digits and that suffix.
    """
    name = _INVALID_KEY_CHAR.sub("_", key)
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith("..") or norm.startswith("/"):
        name = name.replace("/", "_")
        if not name or name == "." or name.startswith(".."):
            name = "_" + name
    return shortened(name, key, _MAX_KEY, tagged=name != key)


def _check_tag_key(key: str) -> None:
    if mlflow_key(key) != key:
        raise arg_value_error(
            _OWNER, "tags", f"has a key MLflow refuses: {key!r} (letters, digits, _-. :/)"
        )


def _reachable(uri: str, timeout: float) -> str | None:
    """None when ``uri`` is not HTTP or accepts a TCP connection; else why not."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


class MLflowEventHandler(TrackerEventHandler):
    """Sends each closed Stat window to an MLflow run, off the logging thread.

    ``MLflowEventHandler(tracking_uri=None, run_id=None, experiment_name=None,
    *, run_name=None, tags=None, step=None, other_events=True,
    max_queue=10000, batch_size=1000, export_timeout=5.0, retry_interval=2.0)``

    - ``tracking_uri``: MLflow's (``http://host:5000``, ``sqlite:///mlflow.db``,
      ...); ``None``: ``mlflow.get_tracking_uri()`` (``MLFLOW_TRACKING_URI``).
    - ``run_id``: log to that run. ``None``: the active run
      (``mlflow.active_run()``) when there is one and ``tracking_uri`` is
      ``None``; otherwise the handler creates a run, one per process (so one
      per rank under torchrun), in ``experiment_name`` (created if missing;
      ``None``: MLflow's default, ``MLFLOW_EXPERIMENT_NAME`` /
      ``MLFLOW_EXPERIMENT_ID`` or the active experiment), named ``run_name``
      (``None``: ``rank<rank>``, prefixed by ``<job>-`` under torchrun),
      tagged with ``torchmon.rank_info().labels()`` (``rank``,
      ``local_rank``, ``node``, ``job``), ``host`` and ``tags``; it ends that
      run (``FINISHED``) at :meth:`close` and at exit. The run is created
      by the sender thread; the constructor waits for it at most
      ``min(export_timeout, 5)`` seconds (``run_id`` is ``None`` until then).
    - ``step``: ``None``: the window's number per Stat (1, 2, 3...); or a
      callable returning the step (``lambda: global_step``), called when
      the window closes.
    - ``other_events``: Events other than Stat windows become run tags
      ``<event name>.<field>`` = ``str(value)`` (a tag is overwritten by the
      next such event; params are write-once in MLflow, and these events
      repeat); ``False`` ignores them.
    - ``max_queue``, ``batch_size`` (at most 1,000, MLflow's cap per
      ``log_batch``), ``export_timeout``, ``retry_interval``: the queue and
      the delivery (docs/sinks.md, "Experiment trackers").
    """

    _OWNER = _OWNER
    _renames_because = "MLflow refuses it as it is"
    _tracker_key = staticmethod(mlflow_key)

    __slots__ = (
        "_client",
        "_created",
        "_experiment_name",
        "_other_events",
        "_rest",
        "_run_id",
        "_run_name",
        "_tags",
        "_tracking_uri",
    )

    def __init__(
        self,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        experiment_name: str | None = None,
        *,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        step: StepOption = None,
        other_events: bool = True,
        max_queue: int = DEFAULT_MAX_QUEUE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        export_timeout: float | None = None,
        retry_interval: float | None = None,
    ) -> None:
        require(_OWNER, "mlflow", library="MLflow", pip_name="'mlflow>=3,<3.18'", extra="mlflow")
        import mlflow
        from mlflow.tracking import MlflowClient

        for name, value in (
            ("tracking_uri", tracking_uri),
            ("run_id", run_id),
            ("experiment_name", experiment_name),
            ("run_name", run_name),
        ):
            if value is not None and not isinstance(value, str):
                raise arg_type_error(_OWNER, name, "a str or None", value)
            if value == "":
                raise arg_value_error(_OWNER, name, "must not be empty")
        if not isinstance(other_events, bool):
            raise arg_type_error(_OWNER, "other_events", "a bool", other_events)
        self._tags = check_mapping(
            tags,
            _OWNER,
            "tags",
            expected="str to str",
            key_noun="keys",
            check_key=_check_tag_key,
            value_types=(str,),
            value_text="a str",
        )
        uri = tracking_uri if tracking_uri is not None else mlflow.get_tracking_uri()
        self._tracking_uri = uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._other_events = other_events
        self._created = 0  # the pid of the process that created the run
        super().__init__(
            destination=f"MLflow at {uri}",
            step=step,
            max_queue=max_queue,
            batch_size=batch_size,
            export_timeout=export_timeout,
            retry_interval=retry_interval,
            max_batch_size=MAX_METRICS_PER_BATCH,
        )
        self._client = MlflowClient(tracking_uri=uri)
        self._rest = _rest_caller(self._client, self._timeout)
        if run_id is None and tracking_uri is None and experiment_name is None:
            active = mlflow.active_run()
            if active is not None:
                run_id = active.info.run_id
        self._run_id = run_id
        if run_id is None:
            # The run is created by the sender; the caller waits a bounded
            # time for it (docs/sinks.md, "Which run"), however the server
            # answers.
            wait = min(self._timeout, MAX_CONSTRUCTOR_WAIT)
            self._start_early(wait)
            if self._run_id is None and not self._failing:
                self._report_line(
                    f"no run created at {uri} within {wait:g} s: the sender thread "
                    f"goes on trying; the windows are queued (at most {self._max_queue})"
                )

    @property
    def run_id(self) -> str | None:
        """The run the windows go to; ``None`` until the handler could create it."""
        return self._run_id

    @property
    def tracking_uri(self) -> str:
        return self._tracking_uri

    # --- the sender thread (TrackerEventHandler's hooks) ------------------

    def _start(self) -> None:
        if self._run_id is not None:
            return
        why = _reachable(self._tracking_uri, min(1.0, self._timeout))
        if why is not None:
            raise ConnectionError(why)
        from mlflow.exceptions import MlflowException

        from .._rank import rank_info

        store = _Store(self._client, self._rest)
        info = rank_info()
        if self._experiment_name is not None:
            experiment_id = store.experiment_id(self._experiment_name)
            if experiment_id is None:
                try:
                    experiment_id = store.create_experiment(self._experiment_name)
                except MlflowException:  # another rank created it meanwhile
                    experiment_id = store.experiment_id(self._experiment_name)
                    if experiment_id is None:
                        raise
        else:
            experiment_id = _default_experiment_id()
        tags = {**info.labels(), "host": info.host, **self._tags}
        name = self._run_name
        if name is None:
            name = f"rank{info.rank}" if info.run_id is None else f"{info.run_id}-rank{info.rank}"
        self._run_id = store.create_run(experiment_id, tags, name)
        self._created = os.getpid()  # a forked child does not end it

    def _send(self, batch: list[Row]) -> None:
        from mlflow.entities import Metric

        assert self._run_id is not None  # _start ran
        key = self._key
        metrics = [
            Metric(key(name), value, timestamp, step) for name, value, step, timestamp in batch
        ]
        if self._rest is not None:
            self._rest.log_batch(self._run_id, metrics, [])
        else:
            self._client.log_batch(self._run_id, metrics=metrics)

    def _other(self, event: Event) -> Any:
        if not self._other_events:
            return None
        return (event.name, event.data)

    def _send_others(self, items: list[Any]) -> None:
        from mlflow.entities import RunTag

        assert self._run_id is not None
        latest: dict[str, str] = {}
        for name, data in items:
            for field, value in data.items():
                tag = self._key(f"{name}.{field}")
                latest.pop(tag, None)  # the last value wins, in its place
                latest[tag] = str(value)[:_MAX_TAG_VALUE]
        tags = [RunTag(k, v) for k, v in latest.items()]
        for i in range(0, len(tags), _MAX_TAGS_PER_BATCH):
            chunk = tags[i : i + _MAX_TAGS_PER_BATCH]
            if self._rest is not None:
                self._rest.log_batch(self._run_id, [], chunk)
            else:
                self._client.log_batch(self._run_id, tags=chunk)

    def _finish(self) -> None:
        if self._created == os.getpid() and self._run_id is not None:
            self._client.set_terminated(self._run_id)

    def __repr__(self) -> str:
        return f"MLflowEventHandler(tracking_uri={self._tracking_uri!r}, run_id={self._run_id!r})"


def _default_experiment_id() -> str:
    """MLflow's experiment for a new run: the active one,
    ``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_EXPERIMENT_ID``, else ``"0"``."""
    try:
        from mlflow.tracking.fluent import _get_experiment_id

        found = _get_experiment_id()
        if found:
            return str(found)
    except Exception:
        pass
    return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"


class _Store:
    """The calls that create a run: over HTTP without MLflow's retries
    (``_Rest``), else the client's."""

    def __init__(self, client: Any, rest: _Rest | None) -> None:
        self.client = client
        self.rest = rest

    def experiment_id(self, name: str) -> str | None:
        if self.rest is None:
            found = self.client.get_experiment_by_name(name)
            return None if found is None else str(found.experiment_id)
        from mlflow.exceptions import MlflowException
        from mlflow.protos.service_pb2 import GetExperimentByName

        try:
            got = self.rest.call(GetExperimentByName(experiment_name=name))
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return str(got.experiment.experiment_id)

    def create_experiment(self, name: str) -> str:
        if self.rest is None:
            return str(self.client.create_experiment(name))
        from mlflow.protos.service_pb2 import CreateExperiment

        return str(self.rest.call(CreateExperiment(name=name)).experiment_id)

    def create_run(self, experiment_id: str, tags: dict[str, str], name: str) -> str:
        if self.rest is None:
            return str(self.client.create_run(experiment_id, tags=tags, run_name=name).info.run_id)
        import time

        from mlflow.protos.service_pb2 import CreateRun, RunTag

        request = CreateRun(
            experiment_id=experiment_id,
            user_id=tags.get("mlflow.user", "unknown"),
            start_time=int(time.time() * 1000),
            tags=[RunTag(key=k, value=v) for k, v in tags.items()],
            run_name=name,
        )
        return str(self.rest.call(request).run.info.run_id)


class _Rest:
    """For an HTTP tracking server: one request per call, without MLflow's
    retries (seven, with exponential backoff: minutes against a server that
    answers 500 or is down), within ``timeout`` seconds, so that an outage
    is seen at once and retried by the handler, and the constructor returns
    in time."""

    def __init__(self, store: Any, timeout: float) -> None:
        self.store = store
        self.timeout = timeout

    def call(self, request: Any) -> Any:
        from mlflow.utils.proto_json_utils import message_to_json, parse_dict
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        endpoint, method = self.store._METHOD_TO_INFO[type(request)]
        body = json.loads(message_to_json(request))
        response = http_request(  # type: ignore[no-untyped-call]
            host_creds=self.store.get_host_creds(),
            endpoint=endpoint,
            method=method,
            max_retries=0,
            timeout=self.timeout,
            **({"params": body} if method == "GET" else {"json": body}),
        )
        verify_rest_response(response, endpoint)
        reply = type(request).Response()
        parse_dict(js_dict=response.json(), message=reply)  # type: ignore[no-untyped-call]
        return reply

    def log_batch(self, run_id: str, metrics: list[Any], tags: list[Any]) -> None:
        from mlflow.protos.service_pb2 import LogBatch

        self.call(
            LogBatch(
                run_id=run_id,
                metrics=[m.to_proto() for m in metrics],
                tags=[t.to_proto() for t in tags],
            )
        )


def _rest_caller(client: Any, timeout: float) -> _Rest | None:
    """``_Rest`` for an HTTP tracking server, ``None`` for other stores
    (their client calls are used)."""
    try:
        from mlflow.protos.service_pb2 import LogBatch
        from mlflow.store.tracking.rest_store import RestStore

        store = client._tracking_client.store
        if not isinstance(store, RestStore) or LogBatch not in store._METHOD_TO_INFO:
            return None
    except Exception:  # another MLflow layout: its client, with its retries
        return None
    return _Rest(store, timeout)
