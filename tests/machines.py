"""What the stateful (hypothesis) tests of a queue share: its temporary directory, and
the check of a delivery against the model."""

from __future__ import annotations

import shutil
import tempfile
from typing import ClassVar

from hypothesis.stateful import RuleBasedStateMachine

import ledgerq

__all__ = ["TempQueueMachine", "delivered_as_expected"]


class TempQueueMachine(RuleBasedStateMachine):
    """A state machine over a queue in a temporary directory of its own.

    ``self.path`` names the queue there (a subclass opens it, as ``self.q`` or more
    handles); at teardown the handles of :meth:`open_handles` are closed and the
    directory removed.
    """

    tmp_prefix: ClassVar[str] = "ledgerq-model-"
    q: ledgerq.Queue

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix=self.tmp_prefix)
        self.path = f"{self.tmp}/q"

    def open_handles(self) -> list[ledgerq.Queue]:
        """The handles teardown closes: ``self.q``."""
        return [self.q]

    def teardown(self) -> None:
        for q in self.open_handles():
            q.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def delivered_as_expected(
    msg: ledgerq.Message | None, expected: int | None
) -> ledgerq.Message | None:
    """Check that a dequeue returned what the model expects - the message of id
    ``expected``, or nothing (``None``) - and return it."""
    if expected is None:
        assert msg is None, f"got {msg} when the model expects nothing"
        return None
    assert msg is not None, f"expected message {expected}, got nothing"
    assert msg.id == expected, f"expected id {expected}, got {msg.id}"
    return msg
