"""Queue options: the keyword arguments of ``ledgerq.open``, as a frozen dataclass."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, get_args

from ledgerq._errors import ConfigError
from ledgerq._types import Compression, SyncMode

__all__ = [
    "COMPRESSIONS",
    "MAX_SECONDS",
    "NEVER_STORED",
    "SYNC_MODES",
    "OpenOptions",
    "Options",
    "storable_options",
]

logger = logging.getLogger("ledgerq")

SYNC_MODES: tuple[SyncMode, ...] = get_args(SyncMode)
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
_MIB = 1024 * 1024
_KEY_SIZE = 32  # AES-256 (format.sealing.KEY_SIZE; not imported: options sit below format)
# Options never written to meta.json or options.json: the encryption key above all.
NEVER_STORED = frozenset({"encryption_key"})

MAX_SECONDS = 100 * 365.25 * 24 * 3600
"""The longest duration ledgerq takes, in seconds (100 years): a ``ttl``, a duration
option.  Beyond it (infinity included) a ``ttl`` or an option is refused, a wait
``timeout`` means forever.  Times are stored as integer nanoseconds since the epoch,
which a signed 64-bit field holds until the year 2262: now + 100 years fits."""


def _seconds(name: str, value: object, *, positive: bool, allow_none: bool) -> None:
    """A duration option: a number of seconds >= 0 (> 0 if ``positive``), finite and at
    most :data:`MAX_SECONDS`; the message states the bound that was broken."""
    if value is None and allow_none:
        return
    bound = "> 0" if positive else ">= 0"
    disable = ", or None to disable" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"option {name} must be a number of seconds{disable}, got {type(value).__name__}"
        )
    low_ok = value > 0 if positive else value >= 0  # NaN fails both
    if not (low_ok and value <= MAX_SECONDS):
        raise ConfigError(
            f"option {name} must be a number of seconds {bound} and at most "
            f"{MAX_SECONDS:.0f} (100 years){disable}; got {value!r}"
        )


def _factor(name: str, value: object, *, low: float, high: float) -> None:
    """A dimensionless option: a number from ``low`` to ``high`` (NaN refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"option {name} must be a number, got {type(value).__name__}")
    if not low <= value <= high:  # NaN fails it
        raise ConfigError(f"option {name} must be a number from {low:g} to {high:g}, got {value!r}")


def _integer(
    name: str,
    value: object,
    *,
    minimum: int,
    maximum: int | None = None,
    allow_none: bool = False,
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"option {name} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ConfigError(f"option {name} must be an int {bound}, got {value!r}")


def _still_valid(
    cls: type[Options], remembered: dict[str, Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The stored options that still validate beside ``kwargs``; each other one is logged.

    A value stored by an older ledgerq (or edited by hand) that no longer validates
    must not take the valid ones with it: only the bad option falls back to its default.
    """
    try:
        cls(**remembered, **kwargs)
    except ConfigError:
        cls(**kwargs)  # a bad value given now is the caller's error: raise it
    else:
        return remembered
    kept: dict[str, Any] = {}
    for name, value in remembered.items():
        try:
            cls(**kept, **{name: value}, **kwargs)
        except ConfigError as exc:
            logger.warning(
                "ledgerq: ignoring the stored option %s=%r (%s); using its default",
                name,
                value,
                exc,
            )
            continue
        kept[name] = value
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """Every option of a queue; see the table in the usage guide.

    Invalid values raise :class:`ledgerq.ConfigError` when the object is built.
    """

    segment_size: int = 64 * _MIB
    index_interval: int = 4096
    sync: SyncMode = "interval"
    sync_interval: float = 1.0
    priorities: bool = False
    starvation_after: float | None = 30.0
    max_retries: int = 3
    visibility_timeout: float | None = None
    retry_delay: float = 0.0
    retry_backoff: float = 2.0
    retry_delay_max: float = 3600.0
    retry_jitter: float = 0.0
    dedup_window: float | None = None
    dedup_max_entries: int = 100_000
    compression: Compression = "none"
    compression_level: int = 3
    compression_min_size: int = 1024
    max_message_size: int = 16 * _MIB
    retention_max_age: float | None = None
    retention_max_bytes: int | None = None
    max_pending: int | None = None
    max_pending_bytes: int | None = None
    # 32 bytes: AES-256-GCM encryption at rest (docs/encryption.md).  Never stored,
    # never in repr(), errors or logs.
    encryption_key: bytes | None = None

    def __repr__(self) -> str:
        """Show every option but the encryption key, which is masked."""
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "encryption_key" and value is not None:
                shown.append(f"{f.name}=<{len(value)} bytes, hidden>")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"Options({', '.join(shown)})"

    def __post_init__(self) -> None:
        _integer("segment_size", self.segment_size, minimum=1)
        _integer("index_interval", self.index_interval, minimum=1)
        if self.sync not in SYNC_MODES:
            raise ConfigError(f"option sync must be one of {SYNC_MODES}, got {self.sync!r}")
        _seconds("sync_interval", self.sync_interval, positive=False, allow_none=False)
        if not isinstance(self.priorities, bool):
            raise ConfigError("option priorities must be True or False")
        _seconds("starvation_after", self.starvation_after, positive=True, allow_none=True)
        _integer("max_retries", self.max_retries, minimum=0)
        _seconds("visibility_timeout", self.visibility_timeout, positive=True, allow_none=True)
        _seconds("retry_delay", self.retry_delay, positive=False, allow_none=False)
        _factor("retry_backoff", self.retry_backoff, low=1.0, high=1e6)
        _seconds("retry_delay_max", self.retry_delay_max, positive=False, allow_none=False)
        _factor("retry_jitter", self.retry_jitter, low=0.0, high=1.0)
        _seconds("dedup_window", self.dedup_window, positive=False, allow_none=True)
        _integer("dedup_max_entries", self.dedup_max_entries, minimum=1)
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"option compression must be one of {COMPRESSIONS}, got {self.compression!r}"
            )
        # zstd's own range of levels (negative levels are its fast modes)
        _integer("compression_level", self.compression_level, minimum=-131072, maximum=22)
        _integer("compression_min_size", self.compression_min_size, minimum=0)
        _integer("max_message_size", self.max_message_size, minimum=1, maximum=1 << 30)
        _seconds("retention_max_age", self.retention_max_age, positive=False, allow_none=True)
        _integer("retention_max_bytes", self.retention_max_bytes, minimum=1, allow_none=True)
        # A bound of 0 would refuse every enqueue: None (the default) is "unbounded".
        _integer("max_pending", self.max_pending, minimum=1, allow_none=True)
        _integer("max_pending_bytes", self.max_pending_bytes, minimum=1, allow_none=True)
        key = self.encryption_key
        if key is not None:
            if type(key) is not bytes:
                raise TypeError(
                    "option encryption_key must be bytes (32 of them) or None, got "
                    f"{type(key).__name__}"
                )
            if len(key) != _KEY_SIZE:
                raise ConfigError(
                    f"option encryption_key must be exactly {_KEY_SIZE} bytes (AES-256), "
                    f"got {len(key)} bytes"
                )

    @classmethod
    def from_kwargs(
        cls,
        options: Options | None,
        kwargs: Mapping[str, Any],
        stored: Mapping[str, Any] | None = None,
    ) -> Options:
        """Merge an ``Options`` object with keyword overrides; unknown names raise TypeError.

        Without an ``Options`` object, options not given as keywords take the values
        ``stored`` with the queue (what it was last opened with), then the defaults.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        stored = {k: v for k, v in (stored or {}).items() if k not in NEVER_STORED}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"valid options are {', '.join(sorted(names))}"
            )
        if options is None:
            if stored:
                remembered = {k: v for k, v in stored.items() if k in names and k not in kwargs}
                return cls(**_still_valid(cls, remembered, kwargs), **kwargs)
            return cls(**kwargs)
        if not isinstance(options, Options):
            raise TypeError(f"options must be ledgerq.Options, got {type(options).__name__}")
        return dataclasses.replace(options, **kwargs) if kwargs else options


class OpenOptions(TypedDict, total=False):
    """The keyword options of :func:`ledgerq.open` (every field of :class:`Options`).

    For type checkers: ``open(path, **options: Unpack[OpenOptions])`` lets them flag a
    misspelled option or a value of the wrong type (``sync="sometimes"``) before it
    runs.  Functions that pass options on to ``ledgerq.open`` take them the same way.
    """

    segment_size: int
    index_interval: int
    sync: SyncMode
    sync_interval: float
    priorities: bool
    starvation_after: float | None
    max_retries: int
    visibility_timeout: float | None
    retry_delay: float
    retry_backoff: float
    retry_delay_max: float
    retry_jitter: float
    dedup_window: float | None
    dedup_max_entries: int
    compression: Compression
    compression_level: int
    compression_min_size: int
    max_message_size: int
    retention_max_age: float | None
    retention_max_bytes: int | None
    max_pending: int | None
    max_pending_bytes: int | None
    encryption_key: bytes | None


def storable_options(options: Options) -> dict[str, object]:
    """The options as ``meta.json`` stores them: every one but :data:`NEVER_STORED`."""
    return {
        f.name: getattr(options, f.name)
        for f in dataclasses.fields(options)
        if f.name not in NEVER_STORED
    }
