"""Finding the Kestrel queues in a journal directory and telling their formats apart.

Old journals (Kestrel 1.x/2.x) have no header; Kestrel 3 files start with a magic
(``27 64 26 03`` writer, ``26 3C 26 03`` reader bookmark), whose first byte is no
valid old opcode, so one byte tells the formats apart.  A queue's name is the file
name up to the first ``.`` (and before any ``~~`` of a temporary file).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ledgerq.kestrel.journal3 import READER_MAGIC, WRITER_MAGIC, file_magic

__all__ = ["KESTREL2", "KESTREL3", "KestrelQueue", "queue_name_of", "scan_directory"]

KESTREL2 = "kestrel-1/2"
KESTREL3 = "kestrel-3"
_WRITER3 = re.compile(r"^(?P<queue>[^.~]+)\.(?P<ts>[0-9]+)\Z")
_READER3 = re.compile(r"^(?P<queue>[^.~]+)\.read\.(?P<reader>[^~]*)\Z")


def queue_name_of(file_name: str) -> str:
    """The queue a journal file belongs to: its name up to the first '.' or '~~'."""
    return file_name.split("~~", 1)[0].split(".", 1)[0]


@dataclass
class KestrelQueue:
    """The journal files of one queue in a directory."""

    name: str
    format: str
    names: list[str] = field(default_factory=list)  # every file of the queue (sorted)
    writers: list[str] = field(default_factory=list)  # Kestrel 3 writer files
    readers: dict[str, str] = field(default_factory=dict)  # Kestrel 3: reader name -> file
    ignored: list[tuple[str, str]] = field(default_factory=list)

    @property
    def parent(self) -> str | None:
        """For a Kestrel 2 fan-out child ``q+x``: ``q``."""
        return self.name.split("+", 1)[0] if "+" in self.name else None


def scan_directory(directory: str) -> dict[str, KestrelQueue]:
    """Every queue with journal files in ``directory``, by name.

    Raises ``FileNotFoundError``/``NotADirectoryError`` for a missing directory.
    """
    names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
    grouped: dict[str, list[str]] = {}
    for name in names:
        queue = queue_name_of(name)
        if queue:
            grouped.setdefault(queue, []).append(name)
    found: dict[str, KestrelQueue] = {}
    for queue, files in grouped.items():
        magics = {}
        for name in files:
            if "~" in name:
                continue
            try:
                magics[name] = file_magic(os.path.join(directory, name))
            except OSError:
                continue
        is_v3 = any(m in (WRITER_MAGIC, READER_MAGIC) for m in magics.values())
        if not is_v3 and all("~~" in n for n in files):
            continue  # only temporary files: nothing to replay
        entry = KestrelQueue(queue, KESTREL3 if is_v3 else KESTREL2, names=files)
        if is_v3:
            _classify_v3(entry, magics)
        found[queue] = entry
    return found


def _classify_v3(entry: KestrelQueue, magics: dict[str, bytes]) -> None:
    for name in entry.names:
        if "~" in name:
            entry.ignored.append((name, "temporary file (~): ignored, as libkestrel does"))
            continue
        magic = magics.get(name, b"")
        writer = _WRITER3.match(name)
        reader = _READER3.match(name)
        if writer and writer.group("queue") == entry.name:
            if magic == WRITER_MAGIC:
                entry.writers.append(name)
            elif not magic:
                entry.ignored.append(
                    (name, "zero-byte writer file (no magic): skipped, as libkestrel does")
                )
            else:
                entry.ignored.append((name, "writer file name without the writer magic"))
        elif reader and reader.group("queue") == entry.name:
            if magic == READER_MAGIC:
                entry.readers[reader.group("reader")] = name
            else:
                entry.ignored.append((name, "reader file name without the reader magic"))
        else:
            entry.ignored.append((name, "not a Kestrel 3 journal file name"))
