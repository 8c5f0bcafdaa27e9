"""`PipeReader`: an `asyncio.StreamReader` fed from the read end of a pipe it owns.

`loop.connect_read_pipe` would do, but under uvloop (the service's loop) a pipe transport
that is not closed by hand keeps its descriptor after the writer is gone, one per desktop
(uvloop issue #80), and closing it by hand closes the descriptor a second time through the
file object (uvloop issue #763). This reader owns the descriptor and closes it once: at end
of file, or at `close()`, whichever comes first.
"""

from __future__ import annotations

import asyncio
import os


class PipeReader(asyncio.StreamReader):
    """Reads a pipe's read end `fd` on the running loop; `close()` is idempotent."""

    def __init__(self, fd: int, *, limit: int = 1 << 20) -> None:
        super().__init__(limit=limit)
        self._fd: int | None = fd
        self._reading_loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        self._reading_loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.feed_data(data)
        else:
            self.close()

    def close(self) -> None:
        """Stop reading and close the descriptor; readers see the end of the stream."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        self._reading_loop.remove_reader(fd)
        os.close(fd)
        self.feed_eof()
