"""A backend's settings (``TASKS[alias]``), checked once and turned into paths and options.

::

    TASKS = {"default": {"BACKEND": "ledgerq.django.LedgerQBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"path": "/abs/dir", "result_ttl": 86400,
                                     "max_retries": 5}}}

``OPTIONS["path"]`` is the backend's directory: ``queues/<name>/`` holds one ledgerq queue
per Tasks queue, ``results.sqlite3`` the results.  ``result_ttl`` is how long a result is
kept (seconds or a ``timedelta``; default 7 days); ``encryption_key_file`` reads the
queues' encryption key as ``ledgerq --key-file`` does; every other key is a
:func:`ledgerq.open` option for the queues, used by each process for its own handles
(not stored in the queues).  Anything wrong raises ``ImproperlyConfigured`` naming the
setting, when the backend is created (the first use of ``task_backends[alias]``, which
``@task`` makes at import), before anything is created on disk.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

import ledgerq
from ledgerq.tools import key_from_bytes, read_key_file

__all__ = [
    "DEFAULT_RESULT_TTL",
    "QUEUES_DIR",
    "RESULTS_FILE",
    "BackendConfig",
    "check_queue_name",
    "parse_config",
]

DEFAULT_RESULT_TTL = 7 * 24 * 3600.0
QUEUES_DIR = "queues"
RESULTS_FILE = "results.sqlite3"
# A queue's directory is queues/<name>: one path component, short enough for a file
# name with room for what ledgerq puts beside it.
_NAME_MAX_BYTES = 200
_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(ledgerq.Options))
_BACKEND_OPTIONS = frozenset({"path", "result_ttl", "encryption_key_file"})


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """What one ``TASKS`` entry says, checked: the directory, the queues, the options."""

    alias: str
    root: str
    queues: frozenset[str]
    result_ttl: float
    queue_options: Mapping[str, Any]

    @property
    def results_path(self) -> str:
        """The results database."""
        return os.path.join(self.root, RESULTS_FILE)

    def queue_path(self, name: str) -> str:
        """The ledgerq queue of the Tasks queue ``name``."""
        return os.path.join(self.root, QUEUES_DIR, name)

    def setting(self, key: str) -> str:
        """How the settings spell one of this backend's options, for error messages."""
        return f"TASKS[{self.alias!r}]['OPTIONS'][{key!r}]"


def check_queue_name(name: object, where: str) -> str:
    """Return ``name`` if it can be a queue's directory name; else ``ImproperlyConfigured``."""
    if not isinstance(name, str):
        raise ImproperlyConfigured(f"{where}: a queue name must be a str, got {name!r}")
    problem = None
    if not name or name in (".", ".."):
        problem = "it is empty or a relative path component"
    elif name.startswith("."):
        problem = (
            "it starts with a dot (names that start with a dot are hidden, and kept for ledgerq)"
        )
    elif "/" in name or "\\" in name or "\0" in name:
        problem = "it holds a slash, a backslash or a NUL character"
    elif len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX_BYTES:
        problem = f"it is longer than {_NAME_MAX_BYTES} bytes"
    if problem is not None:
        raise ImproperlyConfigured(
            f"{where}: queue name {name!r} cannot be a directory name ({problem}); "
            "use letters, digits, '-', '_' and '.'"
        )
    return name


def _result_ttl(alias: str, value: object) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['result_ttl'] must be a number of seconds or a "
            f"timedelta, got {value!r}"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['result_ttl'] must be > 0 seconds, got {value!r}"
        )
    return float(value)


def _root(alias: str, value: object) -> str:
    where = f"TASKS[{alias!r}]['OPTIONS']['path']"
    if value is None:
        raise ImproperlyConfigured(
            f"{where} is missing: name the directory that holds the backend's queues and "
            "results, by its absolute path"
        )
    if not isinstance(value, (str, os.PathLike)):
        raise ImproperlyConfigured(f"{where} must be a str or a path, got {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or "\0" in path:
        raise ImproperlyConfigured(f"{where} must be a text path without NUL, got {value!r}")
    if not os.path.isabs(path):
        raise ImproperlyConfigured(
            f"{where} is {path!r}, a relative path: give an absolute one (a relative path "
            "would name another directory in each process started from elsewhere, e.g. "
            "os.path.join(BASE_DIR, 'tasks'))"
        )
    return os.path.normpath(path)


def _queue_options(alias: str, options: Mapping[str, Any]) -> dict[str, Any]:
    given = {k: v for k, v in options.items() if k not in _BACKEND_OPTIONS}
    unknown = sorted(set(given) - _OPTION_NAMES)
    if unknown:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}: besides "
            f"{sorted(_BACKEND_OPTIONS)} they are ledgerq.open options "
            f"({', '.join(sorted(_OPTION_NAMES))})"
        )
    if given.get("priorities", True) is not True:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['priorities'] is {given['priorities']!r}: the "
            "backend always orders tasks by priority (leave it out)"
        )
    given["priorities"] = True
    key = given.get("encryption_key")
    if isinstance(key, str):  # 64 hex digits, as in a key file
        given["encryption_key"] = key_from_bytes(key.encode("ascii", "replace"))
        if given["encryption_key"] is None:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['encryption_key'] must be 32 bytes or 64 "
                "hexadecimal digits"
            )
    key_file = options.get("encryption_key_file")
    if key_file is not None:
        if key is not None:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] gives both encryption_key and "
                "encryption_key_file: give the key once"
            )
        try:
            given["encryption_key"] = read_key_file(key_file)
        except ledgerq.ConfigError as exc:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['encryption_key_file']: {exc}"
            ) from None
    try:
        ledgerq.Options(**given)
    except (TypeError, ledgerq.ConfigError) as exc:
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from None
    return given


def parse_config(alias: str, options: object, queues: Iterable[str]) -> BackendConfig:
    """Check a backend's ``OPTIONS`` and ``QUEUES``; raise ``ImproperlyConfigured`` naming
    the setting that is wrong and how to write it.  Creates nothing."""
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {options!r}")
    names = frozenset(check_queue_name(q, f"TASKS[{alias!r}]['QUEUES']") for q in queues)
    return BackendConfig(
        alias=alias,
        root=_root(alias, options.get("path")),
        queues=names,
        result_ttl=_result_ttl(alias, options.get("result_ttl", DEFAULT_RESULT_TTL)),
        queue_options=_queue_options(alias, options),
    )
