"""Type stubs for torchmon's native core (torchmon._core)."""

from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta
from types import MappingProxyType, TracebackType
from typing import ClassVar, Literal, TypeAlias, final

from typing_extensions import Buffer

from torchmon._distribution import Distribution

_Text: TypeAlias = str | bytes | bytearray
_DataValue: TypeAlias = str | int | float | bool
_InValue: TypeAlias = _DataValue | bytes | bytearray
# Keys typed as str only: Mapping is invariant in its key type, so a wider key
# type would reject a dict[str, float], and a union of Mappings defeats mypy's
# inference of dict literals. bytes keys still work at run time (decoded).
_EventData: TypeAlias = Mapping[str, _InValue]

__version__: str

__all__ = [
    "STAT_EVENT",
    "_AGGREGATION_KEY_SUFFIXES",
    "_BUCKET_MIDPOINTS",
    "_TORCH_WAIT_COUNTER_PROBE_KEY",
    "Aggregation",
    "AsyncEventHandler",
    "Event",
    "EventHandlerHandle",
    "Stat",
    "_clock_ms",
    "_close_async_handlers_at_exit",
    "_close_exit_gate",
    "_disable_torch_wait_counters",
    "_drain_async_handlers",
    "_enable_torch_wait_counters",
    "_exit_gate_state",
    "_flush_all_stats",
    "_flush_stats_now",
    "_handler_count",
    "_live_stat_count",
    "_restart_async_handlers_after_fork",
    "_set_clock_ms",
    "_torch_wait_counter_names",
    "_torch_wait_counter_probe_seen",
    "_window_ms_of_seconds",
    "data_value_t",
    "log_event",
    "register_event_handler",
    "unregister_event_handler",
]

STAT_EVENT: str
# The suffixes of a Stat event's keys ("<stat name>.<suffix>"), in the order
# of Aggregation.__members__.
_AGGREGATION_KEY_SUFFIXES: tuple[str, ...]
#: 2 ** ((j + 0.5) / 64) for j in 0..63, the doubles the P aggregations
#: scale to report a bucket (docs/api.md).
_BUCKET_MIDPOINTS: tuple[float, ...]

@final
class Aggregation:
    VALUE: ClassVar[Aggregation]
    MEAN: ClassVar[Aggregation]
    COUNT: ClassVar[Aggregation]
    SUM: ClassVar[Aggregation]
    MAX: ClassVar[Aggregation]
    MIN: ClassVar[Aggregation]
    STDDEV: ClassVar[Aggregation]
    P50: ClassVar[Aggregation]
    P90: ClassVar[Aggregation]
    P95: ClassVar[Aggregation]
    P99: ClassVar[Aggregation]
    P999: ClassVar[Aggregation]
    __members__: ClassVar[MappingProxyType[str, Aggregation]]
    def __new__(cls, value: int | Aggregation) -> Aggregation: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Aggregation], tuple[int]]: ...

@final
class Stat:
    def __new__(
        cls,
        name: _Text,
        aggregations: Iterable[Aggregation],
        window_size: timedelta | float,
        max_samples: int = ...,
    ) -> Stat: ...
    def add(self, v: float) -> None: ...
    def add_many(self, values: Iterable[float] | Buffer) -> None: ...
    def get(self) -> dict[Aggregation, float]: ...
    @property
    def count(self) -> int: ...
    @property
    def name(self) -> str: ...

@final
class Event:
    def __new__(
        cls,
        name: _Text,
        timestamp: datetime | date | time,
        data: _EventData,
    ) -> Event: ...
    @property
    def name(self) -> str: ...
    @name.setter
    def name(self, value: _Text) -> None: ...
    @property
    def timestamp(self) -> datetime: ...
    @timestamp.setter
    def timestamp(self, value: datetime | date | time) -> None: ...
    @property
    def data(self) -> dict[str, _DataValue]: ...
    @data.setter
    def data(self, value: _EventData) -> None: ...
    @property
    def distribution(self) -> Distribution | None: ...
    def __reduce__(
        self,
    ) -> tuple[type[Event], tuple[str, datetime, dict[str, _DataValue]]]: ...

@final
class EventHandlerHandle: ...

@final
class AsyncEventHandler:
    def __new__(
        cls,
        handler: Callable[[Event], object],
        maxsize: int = 1024,
        on_full: Literal["drop", "block"] = "drop",
    ) -> AsyncEventHandler: ...
    def __call__(self, event: Event) -> None: ...
    def flush(self, timeout: float | None = None) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> AsyncEventHandler: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...
    @property
    def handler(self) -> Callable[[Event], object]: ...
    @property
    def maxsize(self) -> int: ...
    @property
    def on_full(self) -> Literal["drop", "block"]: ...
    @property
    def dropped(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def closed(self) -> bool: ...

@final
class data_value_t: ...

def log_event(event: Event) -> None: ...
def register_event_handler(callback: Callable[[Event], object]) -> EventHandlerHandle: ...
def unregister_event_handler(handle: EventHandlerHandle) -> None: ...
def _flush_all_stats() -> None: ...
def _close_async_handlers_at_exit() -> None: ...
def _flush_stats_now() -> int: ...
def _drain_async_handlers(timeout: float | None = None) -> bool: ...
def _close_exit_gate() -> bool: ...
def _exit_gate_state() -> tuple[bool, int, int]: ...
def _restart_async_handlers_after_fork() -> None: ...
def _live_stat_count() -> int: ...
def _handler_count() -> int: ...
def _set_clock_ms(ms: int | None) -> int | None: ...
def _clock_ms() -> int: ...
def _window_ms_of_seconds(seconds: float) -> int: ...

# torch's wait counters (torchmon.bridge.record_wait_counters).
_TORCH_WAIT_COUNTER_PROBE_KEY: str

def _enable_torch_wait_counters(window_ms: int) -> None: ...
def _disable_torch_wait_counters() -> None: ...
def _torch_wait_counter_probe_seen() -> bool: ...
def _torch_wait_counter_names() -> list[str]: ...
