"""torchmon Stats recorded as OpenTelemetry gauges, read back in memory.

Run:  python examples/otel_in_memory.py

``OpenTelemetryEventHandler`` records every closed window on synchronous
gauges of the meter provider it is given. Here the provider's reader is the
SDK's ``InMemoryMetricReader``, so the script can print what an exporter
would send; in a real job, give the provider a
``PeriodicExportingMetricReader`` with an OTLP exporter
(``opentelemetry-exporter-otlp``) instead.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import torchmon
from torchmon import Aggregation


def main() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sink = torchmon.OpenTelemetryEventHandler(
        meter_provider=provider, attributes={"job": "example", "rank": 0}
    )
    handle = torchmon.register_event_handler(sink)
    try:
        loss = torchmon.Stat(
            "train.loss",
            [Aggregation.MEAN, Aggregation.MIN, Aggregation.MAX, Aggregation.COUNT],
            timedelta(milliseconds=100),
        )
        rng = random.Random(0)
        deadline = time.monotonic() + 0.3  # about three windows
        while time.monotonic() < deadline:
            loss.add(rng.uniform(0.5, 1.5))
            time.sleep(0.002)
        del loss  # emits the last, partial window: the gauges now hold it
    finally:
        torchmon.unregister_event_handler(handle)

    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data is not None else []:
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            print(f"scope {scope.name} {scope.version}")
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = ",".join(f"{k}={v}" for k, v in sorted(point.attributes.items()))
                    print(f"{metric.name} {{{attributes}}} {point.value}")
    provider.shutdown()


if __name__ == "__main__":
    main()
