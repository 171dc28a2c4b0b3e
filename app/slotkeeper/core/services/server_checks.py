"""What a face may ask about llama-server's settings before anything runs: which binary a setting
finds, whether an address and arguments would expose the server without a key, and what flash
attention's "auto" chose for a model and why.

The Settings dialog asks these as a person types; the answers are the server code's own rules
(``core.server.locate``, ``core.server.command``), so the faces never import the server package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotkeeper.core.server.command import exposes_without_key

if TYPE_CHECKING:
    import os

    from slotkeeper.core.server.flash_choice import FlashAttnChoice
    from slotkeeper.core.server.locate import ServerBinary

__all__ = ["exposes_without_key", "flash_attn_choice", "locate_server"]


def locate_server(explicit: str | None = None) -> ServerBinary:
    """The llama-server binary ``explicit`` (the setting; None: the usual places) names, and where
    it was found; ``ServerBinaryNotFound`` says where it looked (reads the disk: call it from a job)."""
    from slotkeeper.core.server.locate import locate_server as locate  # only when asked

    return locate(explicit)


def flash_attn_choice(model_facts_file: os.PathLike[str] | str,
                      model_path: os.PathLike[str] | str) -> FlashAttnChoice | None:
    """What the model's last launch passed for flash attention, or a measurement since chose, with
    the reason in words and the figures it came from (None: not launched since the file changed).
    Reads a small file: call it from a job."""
    from slotkeeper.core.model.gguf_info import facts_cache
    from slotkeeper.core.server.flash_choice import remembered_choice

    return remembered_choice(facts_cache(model_facts_file), model_path)
