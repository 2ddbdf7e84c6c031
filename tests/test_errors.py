"""Every ledgerq error survives pickling: worker pools and multiprocessing send them."""

from __future__ import annotations

import errno
import importlib
import multiprocessing
import pickle
import pkgutil
from pathlib import Path

import pytest

import ledgerq
from ledgerq import LedgerQError
from ledgerq.segment.meta import DamagedMetaError

# Arguments for the error classes whose __init__ is not (message: str); a new class with
# its own __init__ must be added here (test_every_error_class_has_an_example says so).
_EXAMPLES: dict[type[LedgerQError], tuple[object, ...]] = {
    ledgerq.QueueLockedError: ("/data/jobs",),
    ledgerq.CorruptionError: ("bad record header", "/data/jobs/segments/1.log", 4096),
    ledgerq.StorageError: (
        "append to",
        "/data/jobs/segments/1.log",
        OSError(errno.ENOSPC, "No space left on device"),
    ),
    DamagedMetaError: ("/data/jobs/meta.json", "cut short: 0 bytes"),
    ledgerq.QueueBusyError: ("the append lock of /data/jobs is held by process 4242",),
}


def _import_everything() -> None:
    """Import every module of ledgerq, so that every error class is defined."""
    for info in pkgutil.walk_packages(ledgerq.__path__, "ledgerq."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an optional dependency that is not installed
            if exc.name is None or exc.name.split(".")[0] == "ledgerq":
                raise


def _all_error_classes() -> list[type[LedgerQError]]:
    _import_everything()
    found: list[type[LedgerQError]] = []
    todo = [LedgerQError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _own_init(cls: type[LedgerQError]) -> type[LedgerQError] | None:
    """The nearest class from ``cls`` up to LedgerQError that defines its own __init__."""
    for klass in cls.__mro__:
        if klass is LedgerQError:
            return None
        if "__init__" in vars(klass):
            return klass  # type: ignore[no-any-return]
    return None


def _example(cls: type[LedgerQError]) -> LedgerQError:
    owner = _own_init(cls)
    if owner is None:
        return cls("message 7 of /data/jobs is not leased")
    return cls(*_EXAMPLES[owner])


ERROR_CLASSES = _all_error_classes()


def test_the_walk_finds_the_errors_of_the_subpackages() -> None:
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"StorageError", "ShipError", "KestrelImportError", "DataDirLockedError"} <= names
    assert {"ServerClosingError", "NotAQueueError", "UnknownMessageError"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__qualname__)
def test_every_error_class_has_an_example(cls: type[LedgerQError]) -> None:
    owner = _own_init(cls)
    assert owner is None or owner in _EXAMPLES, (
        f"{owner} has its own __init__: add its arguments to _EXAMPLES"
    )


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__qualname__)
def test_errors_round_trip_through_pickle(cls: type[LedgerQError]) -> None:
    original = _example(cls)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(original, protocol))
        assert type(copy) is cls
        assert str(copy) == str(original)
        assert copy.args == original.args
        assert vars(copy) == vars(original)
        if isinstance(original, OSError):
            assert isinstance(copy, OSError)
            assert (copy.errno, copy.strerror) == (original.errno, original.strerror)


def test_the_attributes_users_read_survive() -> None:
    locked = pickle.loads(pickle.dumps(ledgerq.QueueLockedError("/data/jobs")))
    assert locked.path == "/data/jobs"
    assert str(locked).count("/data/jobs") == 1  # not formatted twice
    corrupt = pickle.loads(pickle.dumps(ledgerq.CorruptionError("bad", "/s/1.log", 12)))
    assert (corrupt.path, corrupt.offset) == ("/s/1.log", 12)
    assert str(corrupt) == "bad in /s/1.log at offset 12"
    storage = pickle.loads(pickle.dumps(_example(ledgerq.StorageError)))
    assert isinstance(storage, ledgerq.StorageError) and isinstance(storage, OSError)
    assert (storage.errno, storage.path, storage.action) == (
        errno.ENOSPC,
        "/data/jobs/segments/1.log",
        "append to",
    )
    busy = pickle.loads(
        pickle.dumps(ledgerq.QueueBusyError("busy", holder_pid=4242, held="the append lock"))
    )
    assert (busy.holder_pid, busy.held) == (4242, "the append lock")
    unknown = pickle.loads(pickle.dumps(ledgerq.UnknownMessageError("message 7 is not leased")))
    assert isinstance(unknown, KeyError)
    assert str(unknown) == "message 7 is not leased"


def _raise_locked(path: str) -> None:
    raise ledgerq.QueueLockedError(path)


def test_an_error_raised_in_a_worker_process_arrives_whole(tmp_path: Path) -> None:
    with (
        multiprocessing.get_context("spawn").Pool(1) as pool,
        pytest.raises(ledgerq.QueueLockedError) as info,
    ):
        pool.apply(_raise_locked, (str(tmp_path),))
    assert info.value.path == str(tmp_path)
    assert str(info.value) == str(ledgerq.QueueLockedError(str(tmp_path)))
