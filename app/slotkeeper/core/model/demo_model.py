"""The demo: the starter model (``starter_model``), a real small instruct model that answers in
English, so ``--demo``, ``make run`` and the first run's "Use the starter model" work at once.
Importable without what fetches the model (only ``ensure_demo_model`` does that).

The random-weight models ``modelgen`` writes stay for the tests that need each family.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["DEMO_NOTICE", "ensure_demo_model"]

DEMO_NOTICE = (
    "The starter model is SmolLM2-135M-Instruct (98 MB, Apache-2.0): small and quick, good for trying "
    "Slotkeeper, not for real work. Choose a larger model (Model ▸ Download a model…) when you want one."
)


def ensure_demo_model(models_dir: str | Path, progress: Callable[[int, int], None] | None = None) -> Path:
    """The starter model's path: this installation's copy, or fetched into ``models_dir`` (its
    SHA-256 checked; ``progress(done, total)`` in bytes). ``starter_model.StarterUnavailable``
    says why it cannot be had."""
    from slotkeeper.core.model.starter_model import ensure_starter_model

    return ensure_starter_model(models_dir, progress)
