"""Standard input's lines as they arrive, for ``generate``: ``ArrivingLines(fd)`` iterates the
physical lines of a file descriptor (bytes, each with its ``\\n``, as a binary file's lines
are) and says whether the next one can be read without waiting (``ready``), so a caller can
answer the lines it has before it blocks on a line that has not been typed yet.

It reads the descriptor itself rather than ``sys.stdin.buffer``: a line held in Python's
buffer is invisible to ``select``, which would report nothing ready while a line waits.
"""

import os
import select

_READ_BYTES = 1 << 16


class ArrivingLines:
    def __init__(self, fd):
        self.fd = fd
        self._lines = []  # complete lines read, next last (popped from the end)
        self._tail = b""  # the bytes after the last newline read
        self._eof = False

    def __iter__(self):
        while True:
            if self._lines:
                yield self._lines.pop()
            elif self._eof:
                if self._tail:  # a last line without its newline
                    tail, self._tail = self._tail, b""
                    yield tail
                return
            else:
                self._read()

    def _read(self):
        data = os.read(self.fd, _READ_BYTES)  # blocks until something arrives, or the end
        if not data:
            self._eof = True
            return
        *lines, self._tail = (self._tail + data).split(b"\n")
        self._lines = [line + b"\n" for line in reversed(lines)]

    def ready(self):
        """Whether the next line can be read without waiting: one is read already, the input
        has ended, or the descriptor has bytes (or its end) to read. A descriptor ``select``
        cannot watch (a regular file is always ready) counts as ready."""
        if self._lines or self._eof:
            return True
        try:
            return bool(select.select([self.fd], [], [], 0)[0])
        except (OSError, ValueError):
            return True
