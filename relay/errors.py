"""The relay's exceptions, under :class:`~contracts.errors.OutboxRelayError`.

They are signals between the relay's own parts, not errors for an operator: a publish
failure becomes the failed rows' recorded outcome, named by
:func:`relay.retry.classify_failure`, and :class:`Stopped` ends a step of starting. None is
meant to leave the relay; the command line reports one that does as an unexpected error.
"""

from __future__ import annotations

from contracts.errors import OutboxRelayError


class RelayError(OutboxRelayError):
    """Root of the relay's exceptions."""


class RecordRejected(RelayError):
    """The row cannot become a valid Kafka record; ``cause`` is a stable error class."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause


class Stopped(RelayError):
    """The stop came before the step raced with it (:func:`relay.stopping.unless_stopped`)
    finished."""


class PredecessorFailed(RelayError):
    """An earlier batch of the same partition failed, so this one was not handed over."""


class TopicNotFound(RelayError):
    """The broker answered without the topic, and does not create it."""


class TopicLookupPending(RelayError):
    """The topic's first metadata lookup has not answered yet; it goes on in the background."""


class BatchTooLarge(RelayError):
    """The broker refused a batch of several records as too large for its topic: no one
    record was shown too large; the batch limit was lowered and they are sent again."""


class ProducerWasReset(RelayError):
    """The relay gave up on these records and reset the producer; they are retried."""
