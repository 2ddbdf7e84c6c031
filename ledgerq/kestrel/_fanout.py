"""Kestrel 2 fan-out: a queue ``q`` and its children ``q+x`` as one list of items.

A child is fed every item set on ``q`` after the child was created, so the child and
the parent hold suffixes of one stream (and a child may hold items set on it directly).
As Kestrel 3's converter does, each item is imported once, with the queues that hold
it as its members (``""`` for the parent).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ledgerq.kestrel._types import KestrelItem

__all__ = ["Merged", "merge_fanout"]


@dataclass
class Merged:
    """One item and the queues holding it: ``""`` the parent, ``x`` its child ``q+x``."""

    item: KestrelItem
    members: set[str]


def merge_fanout(parent: list[KestrelItem], children: dict[str, list[KestrelItem]]) -> list[Merged]:
    """One list holding every item of the parent and its fan-out children, once.

    A child's copy of an item is found by its payload (the Kestrel 3 converter's rule),
    matching from the end - both queues hold a suffix of the same stream - while
    keeping every queue's own order; items only a child holds are placed just before
    the next item it shares (or at the end).
    """
    merged = [Merged(item, {""}) for item in parent]
    for child, items in sorted(children.items()):
        by_payload: dict[bytes, list[int]] = {}
        for position, entry in enumerate(merged):
            by_payload.setdefault(hashlib.blake2b(entry.item.data).digest(), []).append(position)
        matched: list[int | None] = [None] * len(items)
        upper = len(merged)
        for j in range(len(items) - 1, -1, -1):
            candidates = by_payload.get(hashlib.blake2b(items[j].data).digest(), [])
            best = None
            for k in range(len(candidates) - 1, -1, -1):
                if candidates[k] < upper:
                    best = k
                    break
            if best is not None:
                position = candidates.pop(best)
                matched[j] = position
                upper = position
        inserts: dict[int, list[Merged]] = {}
        target = len(merged)
        for j in range(len(items) - 1, -1, -1):
            at = matched[j]
            if at is not None:
                merged[at].members.add(child)
                target = at
            else:
                inserts.setdefault(target, []).insert(0, Merged(items[j], {child}))
        rebuilt: list[Merged] = []
        for position, entry in enumerate(merged):
            rebuilt.extend(inserts.get(position, []))
            rebuilt.append(entry)
        rebuilt.extend(inserts.get(len(merged), []))
        merged = rebuilt
    return merged
