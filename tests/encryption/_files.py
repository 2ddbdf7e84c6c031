"""Helpers of the encryption tests: what a queue directory holds, byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and mtime (ns), by relative path."""
    found: dict[str, tuple[bytes, int]] = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            found[str(path.relative_to(directory))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return found


def files_holding(directory: Path, needle: bytes) -> list[str]:
    """The files under ``directory`` whose bytes contain ``needle``."""
    return [name for name, (data, _) in snapshot(directory).items() if needle in data]


def segment_bytes(directory: Path) -> bytes:
    """The segment logs of the queue at ``directory``, in name order, concatenated."""
    return b"".join(p.read_bytes() for p in sorted((directory / "segments").glob("*.log")))


def set_encryption_block(queue: Path, block: dict[str, Any]) -> None:
    """Write ``block`` as the ``encryption`` object of the queue's meta.json and of its
    options.json, where there is one: the queue then claims that key check and identity."""
    for name in ("meta.json", "options.json"):
        path = queue / name
        if path.exists():
            value = json.loads(path.read_text())
            value["encryption"] = block
            path.write_text(json.dumps(value))
