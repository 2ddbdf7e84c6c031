"""Power-loss simulation: record a workload's file operations, replay every legal crash.

**Recording.**  :class:`Recorder` interposes (in this process) on ``os.open``,
``os.write``/``writev``/``pwrite``, ``os.fsync``/``fdatasync``, ``os.ftruncate``,
``os.replace``/``rename``, ``os.unlink``/``remove``, ``os.mkdir``, ``os.dup`` and
``os.close`` (and on the builtin ``open`` used by recovery to cut a torn tail) for the
files under one directory, and logs each change with its data, by *inode* (a file keeps
its identity across renames).  The workload (``_child.Workload``, the torture workload)
logs its report lines into the same sequence as *marks*, so the log says which calls
had returned - and which had been made durable - at every point.

**The disk model.**  After a power cut, a file holds its content as of its last
``fsync``/``fdatasync`` plus *a prefix* of the writes made to it since, in order, the
last one of which may be *torn*: cut short, or - the file's size having reached the disk
but not its data - with its tail zeroed.  A directory holds its entries as of its last
``fsync`` plus a prefix of the creations, renames and deletions made in it since.
Files and directories are independent of each other.  Two variants of the model:

* ``strict_mkdir=True`` (the default): POSIX to the letter - a new directory's entry,
  like a file's, needs an fsync of its parent;
* ``strict_mkdir=False``: a new *directory*'s own entry is durable at once (as with
  ext4 and XFS, whose journal commits a mkdir with the next fsync of anything).

**Crash states.**  For every point of the log (after each recorded operation), the
simulation builds disk states that are legal under the model: nothing unsynced
survived; everything survived (a kill -9); unsynced data lost but names kept; names lost
but data kept; for each file, each prefix of its unsynced writes (sampled unless
``exhaustive``), with and without a torn last write, the other files at all or nothing;
for each directory, each prefix of its unsynced entry changes; and a few random
combinations.  Identical states are reopened once.

**Checks.**  Each state is written to a scratch directory and opened with ledgerq; it
must open, and: every message whose enqueue was durable at that point (``sync="always"``:
returned; ``"never"``/``"interval"``: covered by a completed ``sync()``/``close()``) is
in the main queue or the DLQ unless an ack of it had returned (or was in flight); an ack
that was durable is not undone; every message present carries exactly the bytes it was
enqueued with, under the id it was returned with; and a new enqueue gets an id above
every id returned before the cut (ids are never reused).

**Not simulated:** reordering *inside* one write other than a torn tail (a sector in the
middle lost, bytes from another write); a file's data surviving while an *earlier*
unsynced write of the same file does not; lying disks (fsync that returns before the
data is stable); the ``sync="interval"`` background thread (its fsyncs would only add
durability points: scenarios use ``"always"`` and ``"never"``).
"""

from __future__ import annotations

import builtins
import hashlib
import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ledgerq
from ledgerq.tools import iter_messages
from tests.faults._shim import Interposer, quiet_ledgerq, scratch_dir
from tests.torture._child import Workload
from tests.torture._payload import matches, mismatch, token_of

__all__ = [
    "SCENARIOS",
    "SHARED_SCENARIOS",
    "scratch_dir",
    "Recorder",
    "Report",
    "Scenario",
    "check_scenario",
    "record_scenario",
    "run_scenarios",
]

DIR = -1  # the namespace value of a directory
_EVERYTHING = 1_000_000
Op = tuple[Any, ...]


# ---------------------------------------------------------------------- recording


class _TrackedFile:
    """A file opened with the builtin ``open`` for update: its truncations are recorded."""

    def __init__(self, f: Any, recorder: Recorder, uid: int, path: str) -> None:
        self._f = f
        self._recorder = recorder
        self._uid = uid
        self._path = path
        self._fds: list[int] = []

    def truncate(self, size: int | None = None) -> int:
        with self._recorder.lock:
            if size is None:
                size = self._f.tell()
            result: int = self._f.truncate(size)
            self._recorder.ops.append(("truncate", self._uid, size))
            return result

    def fileno(self) -> int:
        fd: int = self._f.fileno()
        with self._recorder.lock:
            self._recorder.fds[fd] = self._path
            self._recorder.targets[fd] = ("file", self._uid, False)
        self._fds.append(fd)
        return fd

    def write(self, data: bytes) -> int:
        raise AssertionError(f"unexpected buffered write to {self._path} (not recorded)")

    def close(self) -> None:
        with self._recorder.lock:
            for fd in self._fds:
                self._recorder.fds.pop(fd, None)
                self._recorder.targets.pop(fd, None)
        self._f.close()

    def __enter__(self) -> _TrackedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class Recorder(Interposer):
    """Log every change to the files under ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.ops: list[Op] = []
        self.names: dict[str, int] = {}  # relative path -> uid, or DIR
        self.initial: dict[int, bytes] = {}
        self.targets: dict[int, tuple[Any, ...]] = {}  # fd -> ("file", uid, append) | ("dir", rel)
        self._uids = 0
        for top, _, files in os.walk(self.root):
            self.names[self.rel(top)] = DIR  # the root itself is ""
            for name in files:
                uid = self._new_uid()
                rel = self.rel(os.path.join(top, name))
                self.names[rel] = uid
                with builtins.open(os.path.join(top, name), "rb") as f:
                    self.initial[uid] = f.read()
        self.initial_names = dict(self.names)
        self._real_open: Callable[..., Any] = builtins.open

    def _new_uid(self) -> int:
        self._uids += 1
        return self._uids

    def rel(self, path: str) -> str:
        """``path`` relative to the root ("" for the root itself)."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        return "" if rel == "." else rel

    def mark(self, line: str) -> None:
        """Log a workload report line at this point of the sequence."""
        with self.lock:
            self.ops.append(("mark", line))

    # ------------------------------------------------------------------ interposing

    def on_dup(self, old: int, new: int) -> None:
        if old in self.targets:
            self.targets[new] = self.targets[old]

    def on_close(self, fd: int) -> None:
        self.targets.pop(fd, None)

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        with self.lock:
            return self._record(name, path, call, args)

    def _record(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        ops = self.ops
        if name == "open":
            rel = self.rel(path)
            flags = args[1]
            existed = rel in self.names
            fd = call()
            if existed and self.names[rel] == DIR:
                self.targets[fd] = ("dir", rel)
                return fd
            if existed:
                uid = self.names[rel]
                if flags & os.O_TRUNC and self.is_mutating_open(flags):
                    ops.append(("truncate", uid, 0))
            else:
                uid = self._new_uid()
                self.names[rel] = uid
                ops.append(("create", rel, uid))
            self.targets[fd] = ("file", uid, bool(flags & os.O_APPEND))
            return fd
        if name in ("write", "writev", "pwrite"):
            fd = args[0]
            _, uid, append = self.targets[fd]
            if name == "pwrite":
                data, offset = bytes(args[1]), args[2]
            else:
                data = bytes(args[1]) if name == "write" else b"".join(bytes(b) for b in args[1])
                offset = os.fstat(fd).st_size if append else os.lseek(fd, 0, os.SEEK_CUR)
            written = call()
            if written:
                ops.append(("write", uid, offset, data[:written]))
            return written
        if name in ("fsync", "fdatasync"):
            target = self.targets[args[0]]
            result = call()
            ops.append(("syncdir", target[1]) if target[0] == "dir" else ("sync", target[1]))
            return result
        if name == "ftruncate":
            _, uid, _ = self.targets[args[0]]
            result = call()
            ops.append(("truncate", uid, args[1]))
            return result
        if name in ("replace", "rename"):
            src, dst = self.rel(os.fspath(args[0])), self.rel(path)
            result = call()
            ops.append(("rename", src, dst))
            self.names[dst] = self.names.pop(src)
            return result
        if name in ("unlink", "remove"):
            rel = self.rel(path)
            result = call()
            ops.append(("unlink", rel))
            self.names.pop(rel, None)
            return result
        if name == "mkdir":
            rel = self.rel(path)
            result = call()
            ops.append(("mkdir", rel))
            self.names[rel] = DIR
            return result
        raise AssertionError(f"unexpected call {name}")  # pragma: no cover

    def _open_file(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = self._real_open(file, mode, *args, **kwargs)
        if not isinstance(file, str | bytes | os.PathLike) or not any(c in mode for c in "wax+"):
            return f
        path = os.path.abspath(os.fsdecode(file))
        if not self._under_root(path):
            return f
        rel = self.rel(path)
        if rel not in self.names or "r" not in mode:
            f.close()
            raise AssertionError(f"unexpected open({path!r}, {mode!r}) (not recorded)")
        return _TrackedFile(f, self, self.names[rel], path)

    def install(self) -> None:
        super().install()
        self._real_open = builtins.open
        builtins.open = self._open_file

    def uninstall(self) -> None:
        if builtins.open is self._open_file:
            builtins.open = self._real_open
        super().uninstall()


# ---------------------------------------------------------------------- the disk model


def _parent(rel: str) -> str:
    return os.path.dirname(rel)


def _apply_name(ns: dict[str, int], op: Op) -> None:
    kind = op[0]
    if kind == "create":
        ns[op[1]] = op[2]
    elif kind == "mkdir":
        ns[op[1]] = DIR
    elif kind == "rename":
        if op[1] in ns:
            ns[op[2]] = ns.pop(op[1])
    elif kind == "unlink":
        ns.pop(op[1], None)


def _apply_data(content: bytes, ops: list[Op], torn: tuple[str, int] | None = None) -> bytes:
    buf = bytearray(content)
    for n, op in enumerate(ops):
        if op[0] == "truncate":
            size = op[2]
            del buf[size:]
            buf.extend(bytes(size - len(buf)))
            continue
        offset, data = op[2], op[3]
        if torn is not None and n == len(ops) - 1:
            how, keep = torn
            data = data[:keep] if how == "cut" else data[:keep] + bytes(len(data) - keep)
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(data)] = data
    return bytes(buf)


@dataclass
class Choice:
    """How much of the unsynced changes a crash state keeps (absent: all of them)."""

    name: str
    names: dict[str, int] = field(default_factory=dict)  # directory -> entry changes kept
    data: dict[int, tuple[int, tuple[str, int] | None]] = field(default_factory=dict)


class Disk:
    """What is durable and what is not, as the recorded operations are applied."""

    def __init__(
        self, names: dict[str, int], initial: dict[int, bytes], strict_mkdir: bool
    ) -> None:
        self.durable_names = dict(names)
        self.pending_names: dict[str, list[Op]] = {}
        self.durable: dict[int, bytes] = dict(initial)
        self.pending: dict[int, list[Op]] = {}
        self.strict_mkdir = strict_mkdir

    def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "create":
            self.durable.setdefault(op[2], b"")
            self.pending_names.setdefault(_parent(op[1]), []).append(op)
        elif kind == "mkdir" and not self.strict_mkdir:
            _apply_name(self.durable_names, op)
        elif kind in ("mkdir", "rename", "unlink"):
            self.pending_names.setdefault(_parent(op[-1]), []).append(op)
        elif kind in ("write", "truncate"):
            self.pending.setdefault(op[1], []).append(op)
        elif kind == "sync":
            uid = op[1]
            self.durable[uid] = _apply_data(self.durable[uid], self.pending.pop(uid, []))
        elif kind == "syncdir":
            for pending in self.pending_names.pop(op[1], []):
                _apply_name(self.durable_names, pending)

    def build(self, choice: Choice) -> dict[str, bytes | None]:
        """The disk content (path -> bytes, or None for a directory) ``choice`` keeps."""
        ns = dict(self.durable_names)
        for directory, ops in self.pending_names.items():
            for op in ops[: choice.names.get(directory, len(ops))]:
                _apply_name(ns, op)
        files: dict[str, bytes | None] = {}
        for rel, uid in ns.items():
            if rel == "":
                continue
            if uid == DIR:
                files[rel] = None
                continue
            ops = self.pending.get(uid, [])
            keep, torn = choice.data.get(uid, (len(ops), None))
            files[rel] = _apply_data(self.durable[uid], ops[:keep], torn)
        # An entry whose directory did not survive did not survive either.
        return {rel: v for rel, v in files.items() if _reachable(rel, files)}

    def choices(self, rng: random.Random, exhaustive: bool) -> Iterator[Choice]:
        """Crash states legal at this point (see the module docstring).

        ``exhaustive``: every prefix of every file's and directory's unsynced changes;
        otherwise a sample of them (the first, the last but one, one at random).
        """
        names = {d: len(o) for d, o in self.pending_names.items() if o}
        data = {u: len(o) for u, o in self.pending.items() if o}
        if not names and not data:
            yield Choice("synced")
            return
        no_names = dict.fromkeys(names, 0)
        no_data: dict[int, tuple[int, tuple[str, int] | None]] = dict.fromkeys(data, (0, None))
        yield Choice("kill9")
        yield Choice("nothing", no_names, no_data)
        yield Choice("data_lost", {}, no_data)
        yield Choice("names_lost", no_names, {})
        for uid, n in data.items():
            ops = self.pending[uid]
            if exhaustive:
                keeps: list[int] = list(range(n))
            else:
                keeps = sorted({0, n - 1, rng.randrange(n)})
            for keep in keeps:
                yield Choice(f"file{uid}:{keep}", {}, {uid: (keep, None)})
                if exhaustive:
                    yield Choice(
                        f"file{uid}:{keep}/others_lost", {}, {**no_data, uid: (keep, None)}
                    )
            yield Choice(f"file{uid}:only", {}, {**no_data, uid: (n, None)})
            for keep in range(1, n + 1) if exhaustive else (n,):
                last = ops[keep - 1]
                if last[0] == "write" and len(last[3]) > 1:
                    cut = rng.randint(1, len(last[3]) - 1)
                    for how in ("cut", "zero"):
                        yield Choice(f"file{uid}:{keep}/{how}{cut}", {}, {uid: (keep, (how, cut))})
        for directory, n in names.items():
            for keep in range(n) if exhaustive else sorted({0, rng.randrange(n)}):
                yield Choice(f"dir{directory!r}:{keep}", {directory: keep}, {})
                yield Choice(f"dir{directory!r}:{keep}/data_lost", {directory: keep}, no_data)
        for r in range(4 if exhaustive else 1):
            picked: dict[int, tuple[int, tuple[str, int] | None]] = {}
            for uid, n in data.items():
                keep = rng.randint(0, n)
                last = self.pending[uid][keep - 1] if keep else None
                torn = None
                tearable = last is not None and last[0] == "write" and len(last[3]) > 1
                if tearable and rng.random() < 0.5:
                    assert last is not None
                    torn = (rng.choice(("cut", "zero")), rng.randint(1, len(last[3]) - 1))
                picked[uid] = (keep, torn)
            kept_names = {d: rng.randint(0, n) for d, n in names.items()}
            yield Choice(f"random{r}", kept_names, picked)


def _reachable(rel: str, files: dict[str, bytes | None]) -> bool:
    parent = _parent(rel)
    while parent:
        if files.get(parent, b"") is not None:  # missing, or not a directory
            return False
        parent = _parent(parent)
    return True


def _digest(files: dict[str, bytes | None]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for rel in sorted(files):
        content = files[rel]
        h.update(rel.encode() + (b"\0D" if content is None else b"\0F%d\0" % len(content)))
        if content is not None:
            h.update(content)
    return h.digest()


def write_tree(target: Path, files: dict[str, bytes | None]) -> None:
    """Materialise a crash state in ``target`` (which must not exist)."""
    target.mkdir()
    for rel in sorted(files):
        content = files[rel]
        path = target / rel
        if content is None:
            path.mkdir(exist_ok=True)
        else:
            path.write_bytes(content)


# ---------------------------------------------------------------------- promises


@dataclass
class Promise:
    """What the library promised at one point of the log."""

    durable_tokens: set[int] = field(default_factory=set)
    acked_tokens: set[int] = field(default_factory=set)  # an ack returned or in flight
    durable_acks: set[int] = field(default_factory=set)
    highest: int = 0  # highest id returned


class Timeline:
    """Walks the marks of a log in order and tells the promise at each point."""

    def __init__(self, sync: str, baseline: dict[int, int] | None = None) -> None:
        self.always = sync == "always"
        self.base = dict(baseline or {})  # id -> token of messages there before recording
        self.events: list[tuple[str, int, int]] = []  # (kind, id, token)
        self.covered = 0  # events before this index are durable (sync never/interval)
        self.op: list[str] | None = None
        self.sync_start = 0
        self.main_tokens: dict[int, int] = dict(self.base)
        self.opened = False
        # Shared mode: several handles, each line marked "<handle>|".  A handle's
        # sync() or close() promises its own calls only (per call, as in exclusive
        # mode), so coverage is kept per handle; ``op``, ``sync_start`` and
        # ``covered`` above are handle 0's (the only one of an exclusive run).
        self.handle_ops: dict[int, list[str] | None] = {}
        self.handle_sync_start: dict[int, int] = {}
        self.handle_covered: dict[int, int] = {}
        self.event_handles: list[int] = []

    def feed(self, line: str) -> None:
        handle = 0
        if "|" in line.split(" ", 1)[0]:
            head, line = line.split("|", 1)
            handle = int(head)
        kind, *rest = line.split(" ")
        if kind == "P":
            self.opened = True
        elif kind == "B":
            self.handle_ops[handle] = rest
            self.handle_sync_start[handle] = len(self.events)
        elif kind == "Z":
            op = self.handle_ops.get(handle)
            if op is not None and op[0] in ("sync", "reopen", "close"):
                self.handle_covered[handle] = self.handle_sync_start[handle]
            self.handle_ops[handle] = None
        elif kind == "E" and rest[2] == "fresh":
            message_id, token = int(rest[0]), int(rest[1])
            self.main_tokens[message_id] = token
            self._event(handle, ("enq", message_id, token))
        elif kind == "A":
            message_id = int(rest[0])
            self._event(handle, ("ack", message_id, self.main_tokens[message_id]))
        elif kind == "D":
            self._event(handle, ("dlq", int(rest[0]), int(rest[2])))
        self.op = self.handle_ops.get(0)
        self.covered = self.handle_covered.get(0, 0)

    def _event(self, handle: int, event: tuple[str, int, int]) -> None:
        self.events.append(event)
        self.event_handles.append(handle)

    def _durable(self) -> list[tuple[str, int, int]]:
        if self.always:
            return self.events
        return [
            event
            for n, (event, handle) in enumerate(zip(self.events, self.event_handles, strict=True))
            if n < self.handle_covered.get(handle, 0)
        ]

    def promise(self) -> Promise:
        p = Promise(durable_tokens=set(self.base.values()), highest=max(self.base, default=0))
        for kind, message_id, token in self._durable():
            if kind == "ack":
                p.durable_acks.add(message_id)
            else:
                p.durable_tokens.add(token)
        for kind, message_id, token in self.events:
            if kind == "ack":
                p.acked_tokens.add(token)
            elif kind == "enq":
                p.highest = max(p.highest, message_id)
        for op in self.handle_ops.values():
            if op is not None and op[0] == "ack":
                p.acked_tokens.add(self.main_tokens[int(op[1])])
        return p


@dataclass
class RunFacts:
    """What the whole recorded run wrote: id -> token in each queue, requeued ids, and
    the ids written by each ``enqueue_batch`` (the random batches and requeue_dlq's)."""

    main: dict[int, int] = field(default_factory=dict)
    dlq: dict[int, int] = field(default_factory=dict)
    requeued: set[int] = field(default_factory=set)
    batches: list[list[int]] = field(default_factory=list)

    @classmethod
    def from_ops(cls, ops: list[Op]) -> RunFacts:
        facts = cls()
        current = ""
        batch: list[int] | None = None
        for op in ops:
            if op[0] != "mark":
                continue
            # (a shared run's marks start with "<handle>|"; its steps do not interleave)
            kind, *rest = op[1].split("|", 1)[-1].split(" ")
            if kind == "B":
                current = rest[0]
                batch = None
            elif kind == "E" and rest[2] == "fresh":
                facts.main[int(rest[0])] = int(rest[1])
                if current == "requeue":
                    facts.requeued.add(int(rest[0]))
                if current in ("batch", "requeue"):
                    if batch is None:
                        batch = []
                        facts.batches.append(batch)
                    batch.append(int(rest[0]))
            elif kind == "S":
                batch = None  # requeue_dlq settles a batch before writing the next one
            elif kind == "D":
                facts.dlq[int(rest[0])] = int(rest[2])
        return facts


def check_state(path: Path, options: dict[str, Any], promise: Promise, facts: RunFacts) -> str:
    """Open a crash state and check it; return what is wrong ("" if nothing)."""
    try:
        q = ledgerq.open(path, **options)
    except Exception as exc:
        return f"open raised {type(exc).__name__}: {exc}"
    problems: list[str] = []
    try:
        q._check()
        main = q.peek(_EVERYTHING)
        stats = q.stats()
        if stats.in_flight or len(q) != len(main):
            problems.append(f"in_flight={stats.in_flight}, len={len(q)}, peek={len(main)}")
        dlq = q.dlq.peek(_EVERYTHING) if (path / "dlq").is_dir() else []
        present: set[int] = set()
        for msg in main:
            token = token_of(msg.payload)
            present.add(token)
            if facts.main.get(msg.id) != token:
                problems.append(f"message {msg.id} (token {token}) was never returned as that id")
            elif not matches(msg, token, moved=msg.id in facts.requeued):
                problems.append(f"message {msg.id}: {mismatch(msg, token)}")
            if msg.id in promise.durable_acks:
                problems.append(f"message {msg.id} is pending again after a durable ack")
        for msg in dlq:
            token = token_of(msg.payload)
            present.add(token)
            if facts.dlq.get(msg.id) != token or not matches(msg, token, moved=True):
                problems.append(f"DLQ message {msg.id} (token {token}) is not what was moved")
        lost = sorted(promise.durable_tokens - promise.acked_tokens - present)
        if lost:
            problems.append(f"durable messages LOST (tokens): {lost[:8]}")
        problems.extend(_cut_batches(path, facts))
        new_id = q.enqueue(b"after the power cut")
        highest = max([promise.highest, *(m.id for m in main)])
        if new_id <= highest:
            problems.append(f"new id {new_id} is not above {highest} (id reused)")
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        try:
            q.close()
        except Exception as exc:
            problems.append(f"close raised {type(exc).__name__}: {exc}")
    return "; ".join(problems)


def _cut_batches(path: Path, facts: RunFacts) -> list[str]:
    """Batches of which the log (as recovered) holds some entries but not all."""
    in_log = {msg.id for msg in iter_messages(path)}
    problems = []
    for batch in facts.batches:
        kept = in_log.intersection(batch)
        if kept and len(kept) != len(batch):
            problems.append(f"batch {batch} was cut to {sorted(kept)} (not all-or-nothing)")
    return problems


# ---------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    """One recorded workload and how its crash states are judged."""

    name: str
    options: dict[str, Any]
    steps: int
    seed: int
    strict_mkdir: bool = True
    # Shared mode: this many handles (``ledgerq.open(path, shared=True)``), each with
    # its own workload; the steps interleave at random.  Handles of one process
    # exclude each other as processes do (one ``flock`` per open file description), so
    # their interleaved writes are the writes several processes would make.
    handles: int = 1


SCENARIOS = (
    # sync="always": everything a call returned is durable - the DLQ, requeue, dedup,
    # priorities, compression, rotation, compaction and checkpoints included.
    Scenario(
        "always-everything",
        {
            "sync": "always",
            "segment_size": 700,
            "index_interval": 128,
            "max_retries": 2,
            "priorities": True,
            "dedup_window": 3600.0,
            "compression": "zstd",
            "compression_min_size": 64,
        },
        steps=40,
        seed=11,
    ),
    Scenario(
        "always-plain",
        {"sync": "always", "segment_size": 1500, "index_interval": 256, "max_retries": 3},
        steps=40,
        seed=12,
    ),
    # sync="never": what a completed sync()/close() covered - DLQ moves and requeues
    # of synced messages included.
    Scenario(
        "never-dlq-dedup",
        {
            "sync": "never",
            "segment_size": 600,
            "index_interval": 128,
            "max_retries": 2,
            "dedup_window": 3600.0,
        },
        steps=50,
        seed=13,
    ),
)


# Shared mode: three handles on one queue (the writes of three processes, interleaved).
# Without dedup ids: the torture workload tells a duplicate by its handle's next id,
# which another handle's appends make stale (the kill -9 torture checks dedup across
# processes).
SHARED_SCENARIOS = (
    Scenario(
        "shared-always",
        {
            "shared": True,
            "sync": "always",
            "segment_size": 700,
            "index_interval": 128,
            "max_retries": 2,
            "priorities": True,
            "compression": "zstd",
            "compression_min_size": 64,
        },
        steps=45,
        seed=21,
        handles=3,
    ),
    Scenario(
        "shared-never",
        {
            "shared": True,
            "sync": "never",
            "segment_size": 600,
            "index_interval": 128,
            "max_retries": 2,
        },
        steps=50,
        seed=22,
        handles=3,
    ),
)


@dataclass
class Recording:
    """A scenario's log and the facts needed to judge its crash states."""

    scenario: Scenario
    ops: list[Op]
    names: dict[str, int]
    initial: dict[int, bytes]
    facts: RunFacts
    baseline: dict[int, int] = field(default_factory=dict)  # id -> token before recording


def record_scenario(
    root: Path,
    scenario: Scenario,
    prepare: Callable[[Path], None] | None = None,
    workload: Callable[[Workload], None] | None = None,
) -> Recording:
    """Run the scenario's workload under a :class:`Recorder`; check the record is complete.

    ``prepare`` may put files in the queue directory first (they count as durable);
    ``workload`` replaces the random steps.
    """
    queue_dir = root / "q"
    queue_dir.mkdir(parents=True)
    baseline: dict[int, int] = {}
    facts_before = RunFacts()
    if prepare is not None:
        prepare(queue_dir)
        baseline, facts_before = _baseline(root, queue_dir, scenario.options)
    recorder = Recorder(queue_dir)
    config = {
        "path": str(queue_dir),
        "options": scenario.options,
        "seed": scenario.seed,
        "token_base": 1_000_000,
    }
    with recorder.installed():
        recorder.mark("O")
        if scenario.handles > 1:
            _run_shared(recorder, config, scenario)
        else:
            work = Workload(
                config, lambda text: [recorder.mark(line) for line in text.splitlines()]
            )
            recorder.mark("P")
            if workload is not None:
                workload(work)
            else:
                for _ in range(scenario.steps):
                    work.step()
            work.close()
    _check_complete(recorder, queue_dir)
    facts = RunFacts.from_ops(recorder.ops)
    facts.main.update(facts_before.main)
    facts.dlq.update(facts_before.dlq)
    facts.requeued.update(facts_before.requeued)
    return Recording(
        scenario, recorder.ops, recorder.initial_names, recorder.initial, facts, baseline
    )


def _baseline(
    root: Path, queue_dir: Path, options: dict[str, Any]
) -> tuple[dict[int, int], RunFacts]:
    """What a prepared queue holds (opened as a copy, so the original stays untouched)."""
    copy = root / "baseline"
    shutil.copytree(queue_dir, copy)
    facts = RunFacts()
    with ledgerq.open(copy, **options) as q:
        for msg in q.peek(_EVERYTHING):
            facts.main[msg.id] = token_of(msg.payload)
            if msg.expires_at is None:
                facts.requeued.add(msg.id)  # no TTL: treat as moved (TTL not checked)
        if (copy / "dlq").is_dir():
            for msg in q.dlq.peek(_EVERYTHING):
                facts.dlq[msg.id] = token_of(msg.payload)
    shutil.rmtree(copy)
    return dict(facts.main), facts


def _run_shared(recorder: Recorder, config: dict[str, Any], scenario: Scenario) -> None:
    """Several shared-mode handles, each a workload, their steps interleaved at random."""
    rng = random.Random(scenario.seed)
    works: list[Workload] = []
    for n in range(scenario.handles):

        def report(text: str, n: int = n) -> None:
            for line in text.splitlines():
                recorder.mark(f"{n}|{line}")

        handle_config = {**config, "seed": config["seed"] + n, "token_base": (n + 1) * 1_000_000}
        works.append(Workload(handle_config, report))
    recorder.mark("P")
    for _ in range(scenario.steps):
        rng.choice(works).step()
    for work in works:
        work.close()


# The state page of shared mode: mapped MAP_SHARED and written through the mapping,
# which no interposer sees.  It holds coordination only, none of it data: after a power
# cut the first handle rebuilds it from the files (docs/architecture.md), so whatever
# bytes of it reached the disk, the replay's (the bytes written when it was created)
# are one legal state.
_MAPPED = "shared/state"  # the queue's, and its DLQ's (dlq/shared/state)


def _check_complete(recorder: Recorder, queue_dir: Path) -> None:
    """The log replayed in full must give exactly the files on disk (nothing escaped it)."""
    disk = Disk(recorder.initial_names, recorder.initial, strict_mkdir=False)
    for op in recorder.ops:
        disk.apply(op)
    simulated = disk.build(Choice("kill9"))
    actual: dict[str, bytes | None] = {}
    for top, _, files in os.walk(queue_dir):
        rel_top = recorder.rel(top)
        if rel_top:
            actual[rel_top] = None
        for name in files:
            actual[recorder.rel(os.path.join(top, name))] = (Path(top) / name).read_bytes()
    for rel in simulated.keys() & actual.keys():
        if rel == _MAPPED or rel.endswith("/" + _MAPPED):
            simulated[rel] = actual[rel]
    if simulated != actual:
        differ = sorted(set(simulated) ^ set(actual)) or [
            k for k in sorted(actual) if simulated.get(k) != actual[k]
        ]
        raise AssertionError(f"the recorder missed changes to {differ[:5]}")


@dataclass
class Report:
    """Figures of checked crash states, and the states that broke a promise."""

    scenarios: int = 0
    operations: int = 0
    points: int = 0
    generated: int = 0
    states: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: Report) -> None:
        self.scenarios += other.scenarios
        self.operations += other.operations
        self.points += other.points
        self.generated += other.generated
        self.states += other.states
        self.failures.extend(other.failures)


def check_scenario(
    recording: Recording,
    scratch: Path,
    *,
    exhaustive: bool = False,
    from_mark: str = "P",
    max_failures: int = 20,
    share: float = 1.0,
) -> Report:
    """Build and check the crash states of every point after the first ``from_mark``.

    ``share``: the part of the distinct crash states checked, drawn at every point (with
    a generator of its own: the states generated are those of the full run).  The short
    runs of the test suite check a part of them at every point of the workload, which
    finds more than all of them at fewer points would; the CLI's runs check all.

    ``from_mark="P"`` (the default) skips crash points inside the first ``open``: a crash
    there leaves ``meta.json.tmp`` and a queue that cannot be opened (a known bug, see
    test_torture.py), which would hide everything else.
    """
    scenario = recording.scenario
    rng = random.Random(scenario.seed)
    disk = Disk(recording.names, recording.initial, scenario.strict_mkdir)
    timeline = Timeline(scenario.options["sync"], recording.baseline)
    report = Report(scenarios=1, operations=sum(op[0] != "mark" for op in recording.ops))
    with quiet_ledgerq():
        _check_points(
            recording,
            scratch,
            disk,
            timeline,
            report,
            rng,
            exhaustive,
            from_mark,
            max_failures,
            share,
        )
    return report


def _check_points(
    recording: Recording,
    scratch: Path,
    disk: Disk,
    timeline: Timeline,
    report: Report,
    rng: random.Random,
    exhaustive: bool,
    from_mark: str,
    max_failures: int,
    share: float,
) -> None:
    scenario = recording.scenario
    pick = random.Random(scenario.seed ^ 0x5EED)  # which states a short run checks
    started = from_mark == ""
    seen: set[bytes] = set()
    marks = 0
    for op in recording.ops:
        if op[0] == "mark":
            timeline.feed(op[1])
            marks += 1
            started = started or op[1] == from_mark
            continue
        disk.apply(op)
        if not started:
            continue
        report.points += 1
        promise = timeline.promise()
        for choice in disk.choices(rng, exhaustive):
            report.generated += 1
            files = disk.build(choice)
            key = _digest(files) + marks.to_bytes(4, "little")
            if key in seen:
                continue
            seen.add(key)
            if share < 1.0 and pick.random() >= share:
                continue
            report.states += 1
            target = scratch / f"state-{os.getpid()}"
            if target.exists():
                shutil.rmtree(target)
            write_tree(target, files)
            problem = check_state(target, scenario.options, promise, recording.facts)
            if problem:
                report.failures.append(
                    f"{scenario.name}: after operation {report.points} {op[:3]!r}, state "
                    f"{choice.name}: {problem}"
                )
                if len(report.failures) >= max_failures:
                    return


def run_scenarios(
    workdir: Path,
    count: int,
    *,
    seed: int = 1,
    exhaustive: bool = False,
    progress: Callable[[str], None] | None = None,
    shared: bool = False,
) -> Report:
    """Run the fixed scenarios, then ``count`` more with options and seeds drawn at random.

    ``shared``: the shared-mode scenarios instead, 2-4 handles each, without dedup ids.
    """
    rng = random.Random(seed)
    scenarios = list(SHARED_SCENARIOS if shared else SCENARIOS)
    for n in range(count):
        sync = rng.choice(("always", "never"))
        options: dict[str, Any] = {
            "sync": sync,
            "segment_size": rng.choice((500, 900, 2000)),
            "index_interval": rng.choice((64, 256, 4096)),
            "max_retries": rng.randint(1, 3),
            "priorities": rng.random() < 0.5,
            "dedup_window": 3600.0 if rng.random() < 0.5 else None,
            "compression": "zstd" if rng.random() < 0.3 else "none",
            "compression_min_size": 64,
        }
        handles = 1
        if shared:
            options["shared"] = True
            options["dedup_window"] = None  # see SHARED_SCENARIOS
            handles = rng.randint(2, 4)
        scenarios.append(
            Scenario(
                f"{'shared-' if shared else ''}random-{seed}-{n}",
                options,
                rng.randint(30, 80),
                rng.randrange(1 << 30),
                handles=handles,
            )
        )
    report = Report()
    for n, scenario in enumerate(scenarios):
        root = workdir / f"pl-{n}"
        recording = record_scenario(root, scenario)
        with scratch_dir(root) as scratch:
            result = check_scenario(recording, scratch, exhaustive=exhaustive)
        report.add(result)
        shutil.rmtree(root, ignore_errors=True)
        if progress is not None:
            progress(
                f"{scenario.name}: {result.operations} operations, {result.points} points, "
                f"{result.states} states, {len(result.failures)} failures"
            )
    return report
