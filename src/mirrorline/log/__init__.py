"""The durable change log (DESIGN §2, §4): segments of whole committed transactions in commit order, one writer,
many readers each at its own position, retention by what every registered reader has applied, and interchange with
deltaflood/daystream lines.

- :class:`LogWriter` (capture, import) appends; :class:`StreamSpill` spills a streamed transaction.
- :class:`ChangeLog` reads (Python), :func:`read_spark` reads into Spark.
- :func:`set_applied` / :func:`retain` register readers and remove what they all applied.
"""

from mirrorline.log.layout import Layout, SegmentInfo
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import ReaderState, readers, retain, set_applied, unregister
from mirrorline.log.spark import read_spark
from mirrorline.log.stream import StreamSpill
from mirrorline.log.writer import LogWriter

__all__ = [
    "ChangeLog",
    "Layout",
    "LogWriter",
    "ReaderState",
    "SegmentInfo",
    "StreamSpill",
    "read_spark",
    "readers",
    "retain",
    "set_applied",
    "unregister",
]
