"""Slotkeeper's own log file, beside llama-server's.

A packaged app has nowhere else to write: a windowed .exe has no stderr at all, and an app started
from Finder or at login writes its stderr to nothing a user can find. So `serve` and the desktop
app also log to ``slotkeeper.log`` in the log folder: private (0600, it can quote a conversation's
words in an error), rotated by size, a few backups kept.

Rotation renames the file. On Windows a rename fails while another process has the file open
(a second launch that is about to find the folder busy, an editor): the handler then keeps
writing to the file it has, and tries again at the next limit, instead of losing the record.
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import sys
from pathlib import Path

APP_LOG_MAX_BYTES = 2 * 1024 * 1024
APP_LOG_BACKUPS = 3
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose files are created 0600 and whose failed rollover is not an error."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if sys.platform != "win32":
            os.fchmod(fd, 0o600)  # made by an earlier run with the umask's mode
        return open(fd, "a", encoding=self.encoding or "utf-8", errors=self.errors)

    def doRollover(self) -> None:
        try:
            super().doRollover()
        except OSError:  # Windows: held open by another process; keep writing where we are
            if self.stream is None:
                self.stream = self._open()


def attach(path: Path, level: int = logging.DEBUG) -> PrivateRotatingFileHandler | None:
    """Log every record of the root logger at ``level`` or above to ``path`` as well. None (and
    nothing changed) when the file cannot be opened: the run goes on with the log it has."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handler = PrivateRotatingFileHandler(path, maxBytes=APP_LOG_MAX_BYTES, backupCount=APP_LOG_BACKUPS,
                                             encoding="utf-8")
    except OSError:
        return None
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(handler)
    return handler


def detach(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger().removeHandler(handler)
        handler.close()
