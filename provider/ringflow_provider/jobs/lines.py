"""A job's output as whole lines: the one line splitter of every job backend, which is the
runtime's (`ringflow.launch.lines`), so mpirun's joined output and the provider's jobs
split lines by the same rules (`\\n`, `\\r\\n`, a lone `\\r`; pieces of at most 1 MiB cut
between UTF-8 characters).
"""

from __future__ import annotations

from ringflow.launch.lines import MAX_LINE_BYTES, TAIL_LINES, LineSink, LineSplitter

__all__ = ["MAX_LINE_BYTES", "TAIL_LINES", "LineSink", "LineSplitter"]
