"""`slotkeeper models ...`: the curated model list, and downloads into the Hugging Face cache."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model import families
from slotkeeper.core.settings import ServerProfile

if TYPE_CHECKING:
    from slotkeeper.core.model.model_catalog import CuratedModel

# model_catalog's, without importing the catalog: every command line builds this parser (`serve`
# starts llama-server right after).
DEFAULT_CTX = ServerProfile().ctx

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.action == "list-curated":
        return _list_curated(args.ctx, args.json)
    return _download(args)


def _list_curated(ctx: int, as_json: bool) -> int:
    from slotkeeper.core.model.model_catalog import CATALOG

    if ctx < 256:
        print("slotkeeper: --ctx must be at least 256", file=sys.stderr)
        return EXIT_USAGE
    if as_json:
        print(json.dumps([curated_json(m, ctx) for m in CATALOG], indent=2))
        return 0
    rows = [("ID", "MODEL", "DOWNLOAD", f"MEMORY @ {ctx}", "RESTORES")]
    for m in CATALOG:
        rows.append((m.id, m.title, f"~{human_bytes(m.download_bytes)}", memory_text(m, ctx),
                     families.describe_restore_mode(m.restore_mode)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print()
    print("Memory is the weights plus the KV cache at that context (one slot, f16 cache); llama-server needs "
          "a few hundred MiB more.")
    print("Download one with `slotkeeper models download ID`.")
    return 0


def memory_text(m: CuratedModel, ctx: int = DEFAULT_CTX) -> str:
    need = m.memory_need(ctx)
    if m.restore_mode == families.RESTORE_NEEDS_SWA_FULL:
        return f"{human_bytes(need.total)} ({human_bytes(need.total_swa_full)} with --swa-full)"
    return human_bytes(need.total)


def curated_json(m: CuratedModel, ctx: int = DEFAULT_CTX) -> dict:
    need = m.memory_need(ctx)
    return {
        "id": m.id,
        "title": m.title,
        "repo_id": m.repo_id,
        "filename": m.filename,
        "quant": m.quant,
        "download_bytes": m.download_bytes,
        "context": need.n_ctx,
        "memory_bytes": need.total,
        "memory_bytes_swa_full": need.total_swa_full,
        "kv_bytes": need.kv_default,
        "kv_bytes_swa_full": need.kv_swa_full,
        "restore_mode": m.restore_mode,
        "training_context": m.context_length,
    }


def _download(args: argparse.Namespace) -> int:
    from slotkeeper.core.model.hub_download import DownloadCancelled, DownloadError, HubDownloader
    from slotkeeper.core.model.model_catalog import CATALOG, find_curated

    if args.file is None:
        entry = find_curated(args.model)
        if entry is None:
            known = ", ".join(m.id for m in CATALOG)
            print(f"slotkeeper: {args.model!r} is not a curated model ({known}); give a repository and a "
                  "file name: `slotkeeper models download OWNER/NAME FILE`", file=sys.stderr)
            return EXIT_USAGE
        repo_id, filename = entry.repo_id, entry.filename
    else:
        repo_id, filename = args.model, args.file

    downloader = HubDownloader(cache_dir=args.cache_dir)
    printer = None if args.quiet else ProgressPrinter(f"{repo_id}/{filename}", sys.stderr)
    cancel = threading.Event()
    try:
        path = downloader.download(repo_id, filename, args.revision, on_progress=printer, cancel=cancel)
    except KeyboardInterrupt:
        if printer:
            printer.finish()
        print("slotkeeper: interrupted; what was downloaded is kept and `models download` continues it",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except DownloadCancelled as exc:
        if printer:
            printer.finish()
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except DownloadError as exc:
        if printer:
            printer.finish()
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if printer:
        printer.finish()
    print(path)
    return 0


class ProgressPrinter:
    """Progress on stderr: one line redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, what: str, out: TextIO) -> None:
        self.what = what
        self.out = out
        self.tty = out.isatty()
        self._started = time.monotonic()
        self._last_decile = -1
        self._drawn = False
        self._announced = False
        self._printed_done = False

    def __call__(self, p) -> None:
        if not self._announced and p.phase != "checking":
            self._announced = True
            verb = "continuing" if p.resumed_from else "downloading"
            print(f"{verb} {self.what}" + (f" from {human_bytes(p.resumed_from)}" if p.resumed_from else ""),
                  file=self.out, flush=True)
        line = self._line(p)
        if self.tty:
            self.out.write("\r" + line.ljust(70))
            self.out.flush()
            self._drawn = True
            return
        decile = int(10 * (p.fraction or 0))
        if decile != self._last_decile or (p.phase == "done" and not self._printed_done):
            self._last_decile = decile
            self._printed_done = p.fraction == 1.0 or p.phase == "done"
            print(line, file=self.out, flush=True)

    def _line(self, p) -> str:
        total = human_bytes(p.total) if p.total else "?"
        pct = f"{100 * p.fraction:5.1f}%" if p.fraction is not None else "   ?  "
        if p.phase == "checking":
            return f"  checking what was already downloaded: {pct}"
        elapsed = time.monotonic() - self._started
        rate = (p.done - p.resumed_from) / elapsed if elapsed > 0 else 0
        return f"  {pct}  {human_bytes(p.done)} of {total}  {human_bytes(rate)}/s"

    def finish(self) -> None:
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False
