"""The demo model's file name and notice, importable without what writes the model.

``modelgen`` writes the demo model and needs gguf and numpy to do it (~22 MB, ~0.3 s to import);
code that only names the demo model or warns about it imports these from here, and imports
``modelgen`` inside the function that writes the model.
"""

from __future__ import annotations

__all__ = ["DEMO_FILENAME", "DEMO_NOTICE"]

DEMO_NOTICE = (
    "The demo model has random weights: it answers with gibberish. It exists so you can "
    "try Slotkeeper without downloading a model."
)
DEMO_FILENAME = "slotkeeper-demo-llama.gguf"
