"""A pytest plugin loaded into llama.cpp's server tests by run_compat.py (``-p compat_plugin``):
one JSON line per test phase in $COMPAT_RESULTS (node id, phase, outcome, and for a failure its
text and the last lines Slotkeeper and the wrapper printed). Not a test file: Slotkeeper's own
pytest never collects it."""

from __future__ import annotations

import json
import os

KEEP = ("slotkeeper", "compat wrapper", "WARNING", "ERROR", " E srv", " E ", "error")


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("COMPAT_RESULTS")
    if not path or (report.when != "call" and report.passed):
        return
    rec = {"id": report.nodeid, "when": report.when, "outcome": report.outcome,
           "duration": round(report.duration, 2), "run": os.environ.get("COMPAT_RUN_ID", "")}
    if hasattr(report, "wasxfail"):
        rec["xfail"] = True
    if report.failed:
        rec["message"] = report.longreprtext[-6000:]
        lines = [line for line in report.capstdout.splitlines() if any(k in line for k in KEEP)]
        rec["log"] = lines[-40:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        rec["message"] = str(report.longrepr[2])
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
