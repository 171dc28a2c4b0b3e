"""Test-only fault injection: ``SLOTKEEPER_FAULT=<step>`` ends the process at that step of a save, a
restore point or a deletion, as a power cut or kill -9 would, so the crash-safety tests exercise the
real code path. Unset (always, outside those tests), each step is one environment lookup."""

from __future__ import annotations

import logging
import os

__all__ = ["FAULT_ENV", "fault_point"]

log = logging.getLogger(__name__)

FAULT_ENV = "SLOTKEEPER_FAULT"
FAULT_EXIT_CODE = 86


def fault_point(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault injection: dying at %s", step)
        os._exit(FAULT_EXIT_CODE)
