"""Public names at their public path: what a face of the package (``ledgerq``,
``ledgerq.tools``, ``ledgerq.workers``, ``ledgerq.ship``) re-exports from the private
modules that define it takes the face's module as its ``__module__``."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable
from typing import Any

__all__ = ["publish"]


def publish(face: str, namespace: dict[str, Any], names: Iterable[str]) -> None:
    """Give the public classes and functions of ``namespace`` among ``names`` the path
    ``<face>.<name>``.

    Reprs, tracebacks, docs and pickles then name what users import, not the private
    module that defines it (pickle finds a class by ``__module__`` + ``__qualname__``,
    so ``<face>.<name>`` must resolve - it does), and a private module can move
    without breaking a pickle.  A class's string annotations (``from __future__ import
    annotations``) are resolved first, in the module that wrote them:
    ``typing.get_type_hints`` looks names up in ``sys.modules[__module__]``, where a
    name like ``Mapping`` is not.
    """
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type):
            own = inspect.get_annotations(obj)
            if own:
                hints = typing.get_type_hints(obj, include_extras=True)
                obj.__annotations__ = {key: hints[key] for key in own}
        elif not callable(obj):
            continue  # constants and type aliases have no module of their own
        obj.__module__ = face
