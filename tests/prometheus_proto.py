"""Prometheus's protobuf exposition decoded by protobuf's own runtime (the
``protobuf`` package, installed with tensorboard): the message classes of
``io.prometheus.client``'s metrics.proto (prometheus/client_model), built here
from a descriptor with the upstream field numbers, so that the bytes torchmon
encodes by hand are read by an independent decoder."""

from __future__ import annotations

from typing import Any

import pytest

descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
from google.protobuf import descriptor_pool, message_factory  # noqa: E402
from google.protobuf.internal.decoder import _DecodeVarint  # noqa: E402

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (message, [(field, number, type, label, message type name or None)])
_MESSAGES: list[tuple[str, list[tuple[str, int, int, int, str | None]]]] = [
    ("LabelPair", [("name", 1, _F.TYPE_STRING, _OPTIONAL, None),
                   ("value", 2, _F.TYPE_STRING, _OPTIONAL, None)]),
    ("Gauge", [("value", 1, _F.TYPE_DOUBLE, _OPTIONAL, None)]),
    ("Bucket", [("cumulative_count", 1, _F.TYPE_UINT64, _OPTIONAL, None),
                ("cumulative_count_float", 4, _F.TYPE_DOUBLE, _OPTIONAL, None),
                ("upper_bound", 2, _F.TYPE_DOUBLE, _OPTIONAL, None)]),
    # google/protobuf/timestamp.proto's.
    ("Timestamp", [("seconds", 1, _F.TYPE_INT64, _OPTIONAL, None),
                   ("nanos", 2, _F.TYPE_INT32, _OPTIONAL, None)]),
    ("BucketSpan", [("offset", 1, _F.TYPE_SINT32, _OPTIONAL, None),
                    ("length", 2, _F.TYPE_UINT32, _OPTIONAL, None)]),
    ("Histogram", [
        ("sample_count", 1, _F.TYPE_UINT64, _OPTIONAL, None),
        ("sample_count_float", 4, _F.TYPE_DOUBLE, _OPTIONAL, None),
        ("sample_sum", 2, _F.TYPE_DOUBLE, _OPTIONAL, None),
        ("bucket", 3, _F.TYPE_MESSAGE, _REPEATED, "Bucket"),
        ("created_timestamp", 15, _F.TYPE_MESSAGE, _OPTIONAL, "Timestamp"),
        ("schema", 5, _F.TYPE_SINT32, _OPTIONAL, None),
        ("zero_threshold", 6, _F.TYPE_DOUBLE, _OPTIONAL, None),
        ("zero_count", 7, _F.TYPE_UINT64, _OPTIONAL, None),
        ("zero_count_float", 8, _F.TYPE_DOUBLE, _OPTIONAL, None),
        ("negative_span", 9, _F.TYPE_MESSAGE, _REPEATED, "BucketSpan"),
        ("negative_delta", 10, _F.TYPE_SINT64, _REPEATED, None),
        ("negative_count", 11, _F.TYPE_DOUBLE, _REPEATED, None),
        ("positive_span", 12, _F.TYPE_MESSAGE, _REPEATED, "BucketSpan"),
        ("positive_delta", 13, _F.TYPE_SINT64, _REPEATED, None),
        ("positive_count", 14, _F.TYPE_DOUBLE, _REPEATED, None),
    ]),
    ("Metric", [("label", 1, _F.TYPE_MESSAGE, _REPEATED, "LabelPair"),
                ("gauge", 2, _F.TYPE_MESSAGE, _OPTIONAL, "Gauge"),
                ("histogram", 7, _F.TYPE_MESSAGE, _OPTIONAL, "Histogram"),
                ("timestamp_ms", 6, _F.TYPE_INT64, _OPTIONAL, None)]),
    ("MetricFamily", [("name", 1, _F.TYPE_STRING, _OPTIONAL, None),
                      ("help", 2, _F.TYPE_STRING, _OPTIONAL, None),
                      ("type", 3, _F.TYPE_ENUM, _OPTIONAL, "MetricType"),
                      ("metric", 4, _F.TYPE_MESSAGE, _REPEATED, "Metric")]),
]  # fmt: skip
METRIC_TYPES = {"COUNTER": 0, "GAUGE": 1, "SUMMARY": 2, "UNTYPED": 3, "HISTOGRAM": 4}


def _metric_family_class() -> Any:
    file = descriptor_pb2.FileDescriptorProto(
        name="torchmon_test_metrics.proto", package="io.prometheus.client", syntax="proto3"
    )
    enum = file.enum_type.add(name="MetricType")
    for name, number in METRIC_TYPES.items():
        enum.value.add(name=name, number=number)
    for message_name, fields in _MESSAGES:
        message = file.message_type.add(name=message_name)
        for name, number, kind, label, type_name in fields:
            field = message.field.add(name=name, number=number, type=kind, label=label)
            if type_name is not None:
                field.type_name = f".io.prometheus.client.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName("io.prometheus.client.MetricFamily")
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is None:  # protobuf before 4.21
        return message_factory.MessageFactory(pool).GetPrototype(descriptor)
    return get_class(descriptor)


MetricFamily = _metric_family_class()


def decode_delimited(body: bytes) -> list[Any]:
    """Every length-delimited MetricFamily in ``body``; the whole body must
    be consumed (a torn body fails here)."""
    families = []
    position = 0
    while position < len(body):
        length, position = _DecodeVarint(body, position)
        assert position + length <= len(body), "a MetricFamily runs past the body's end"
        family = MetricFamily()
        family.ParseFromString(body[position : position + length])
        families.append(family)
        position += length
    return families


def bucket_counts(spans: Any, deltas: Any) -> dict[int, int]:
    """``{bucket key: count}`` of one side of a native histogram."""
    counts: dict[int, int] = {}
    keys = []
    key = 0
    for span in spans:
        # The first offset is the first key; each later one the gap after
        # the previous span.
        key += span.offset
        for _ in range(span.length):
            keys.append(key)
            key += 1
    assert len(keys) == len(deltas), (list(spans), list(deltas))
    count = 0
    for key, delta in zip(keys, deltas):
        count += delta
        assert count >= 0
        counts[key] = count
    return counts
