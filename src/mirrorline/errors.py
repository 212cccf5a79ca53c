"""One base exception for everything a user can cause or meet; each error carries its context.

Every error says what went wrong and what to do. ``retryable`` tells whether trying the same thing again can help
(a dropped connection) or not (a bad configuration, an invalid change sequence). ``exit_code`` is the command line's
exit status for it (DESIGN §9): 2 for usage and configuration errors, 3 for any other failure.
"""

from __future__ import annotations

from typing import Any


def first_line(e: BaseException) -> str:
    """What an error says, in one line (its type's name when it says nothing): for messages that quote it."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class MirrorlineError(Exception):
    """Base of every mirrorline error. ``context`` holds the table, key, position, file... it is about."""

    exit_code = 3
    retryable = False

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.context = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(MirrorlineError):
    """The command line's words are off."""

    exit_code = 2


class ConfigError(MirrorlineError):
    """The configuration file is missing, unreadable or invalid: names the file, the key and the reason."""

    exit_code = 2

    def __init__(self, file: str, key: str | None, reason: str, *, hint: str | None = None) -> None:
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {reason}", hint=hint, file=file, key=key)
        self.file = file
        self.key = key
        self.reason = reason


class SourceError(MirrorlineError):
    """The source PostgreSQL could not be reached or refused what was asked."""


class TransientSourceError(SourceError):
    """A dropped or refused connection that a retry may cure."""

    retryable = True


class DecodeError(MirrorlineError):
    """A pgoutput message (or a log/interchange record) is malformed or truncated: says what and at which byte."""


class LogError(MirrorlineError):
    """The change log is damaged, missing a segment, or asked for a position it no longer retains."""


class InvalidSequenceError(MirrorlineError):
    """A change sequence that breaks the net-change rules (DESIGN §5): names the table, the key and both positions."""

    def __init__(self, table: str, key: Any, first_op: str, first_pos: Any, second_op: str, second_pos: Any) -> None:
        super().__init__(
            f"invalid change sequence on {table} key {key}: {second_op} at {second_pos} "
            f"cannot follow {first_op} at {first_pos}",
            hint="the log does not describe a valid history for this row; check the source or the imported files",
            table=table,
            key=key,
            first_op=first_op,
            first_pos=str(first_pos),
            second_op=second_op,
            second_pos=str(second_pos),
        )
        self.table = table
        self.key = key
        self.first_pos = first_pos
        self.second_pos = second_pos


class Unverified(MirrorlineError):
    """A unit compiled by a route that assumed what its check then found false (``NetBatch.verify``): nothing of it
    may be committed; compile it the general way, which handles or names what the route could not."""


class TargetError(MirrorlineError):
    """A target could not be reached, cannot hold a type, or a change failed to apply there."""


class TransientTargetError(TargetError):
    """A target connection dropped or the server refused work for a reason a retry may cure; nothing was applied."""

    retryable = True


class ApplyError(TargetError):
    """A change failed to apply: names the target, table, key, position and the database's message."""


class SnapshotError(MirrorlineError):
    """An initial load failed, or an exported snapshot folder is damaged, incomplete or foreign."""
