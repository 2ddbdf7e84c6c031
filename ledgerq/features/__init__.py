"""Opt-in feature modules on the core's hooks (see ``ledgerq.core.feature``)."""

from __future__ import annotations

from ledgerq._options import Options
from ledgerq.core.feature import Feature
from ledgerq.features.compression import ZstdCompression, ZstdDecompression
from ledgerq.features.dedup import DedupFeature
from ledgerq.features.dlq import DeadLetterFeature, DeadLetterStore, OpenConfigured
from ledgerq.features.forward import ForwardFeature
from ledgerq.features.periodic import PeriodicFeature
from ledgerq.features.priority import PriorityFeature
from ledgerq.features.ttl import TTLFeature
from ledgerq.features.unique import UniqueFeature

__all__ = ["build_features"]


def build_features(options: Options, open_configured: OpenConfigured) -> list[Feature]:
    """The features ``options`` turn on, in the order the core calls them."""
    features: list[Feature] = [TTLFeature()]
    if options.compression == "zstd":
        features.append(ZstdCompression(options))
    else:
        features.append(ZstdDecompression(options))  # reading old compressed entries
    # Always on (no option: costs nothing until a unique_key comes).  Before dedup: a
    # draft both hold is refused by the first that finds it, and dedup has no unadmit.
    features.append(UniqueFeature(options))
    # Always on too (no option: reads nothing until a queue has a periodic job).
    features.append(PeriodicFeature())
    # Always on too (no option: any queue may be a forward's target; reads nothing until
    # the first forward into it).
    features.append(ForwardFeature())
    if options.dedup_window is not None:
        features.append(DedupFeature(options))
    if options.priorities:
        features.append(PriorityFeature(options))
    if options.max_retries > 0:
        features.append(DeadLetterFeature(options, open_configured))
    else:
        features.append(DeadLetterStore(options, open_configured))
    return features
