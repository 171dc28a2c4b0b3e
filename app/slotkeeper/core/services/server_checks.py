"""What a face may ask about llama-server's settings before anything runs: which binary a setting
finds, and whether an address and arguments would expose the server without a key.

The Settings dialog asks these as a person types; the answers are the server code's own rules
(``core.server.locate``, ``core.server.command``), so the faces never import the server package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotkeeper.core.server.command import exposes_without_key

if TYPE_CHECKING:
    from slotkeeper.core.server.locate import ServerBinary

__all__ = ["exposes_without_key", "locate_server"]


def locate_server(explicit: str | None = None) -> ServerBinary:
    """The llama-server binary ``explicit`` (the setting; None: the usual places) names, and where
    it was found; ``ServerBinaryNotFound`` says where it looked (reads the disk: call it from a job)."""
    from slotkeeper.core.server.locate import locate_server as locate  # only when asked

    return locate(explicit)
