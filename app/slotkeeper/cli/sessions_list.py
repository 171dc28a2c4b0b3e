"""`slotkeeper sessions list --json`, fast: when the sessions folder looks as it did at the last
listing, the rows printed then are printed again (``core.sessions.rows``), before the sessions
code is even imported. Anything else (a changed folder, a folder that is not safe to use) goes
the full way (``cli.sessions``), which also says what is wrong."""

from __future__ import annotations

import argparse

from slotkeeper.cli.output import print_bytes


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """`slotkeeper sessions ...`: the kept rows for `list --json` when they still hold, else the full way."""
    if args.action == "list" and args.json and print_kept_rows(args.data_dir):
        return 0
    from slotkeeper.cli.sessions import run_sessions_command

    return run_sessions_command(args)


def print_kept_rows(data_dir: str | None) -> bool:
    """Print the kept rows and return True, or return False and print nothing."""
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.sessions.rows import kept_listing

    try:
        paths = app_paths(data_dir).ensure()  # refuses folders other users could write to
        listing = kept_listing(paths.sessions_dir, paths.sessions_index_file)
    except (OSError, ValueError):
        return False
    if listing is None:
        return False
    print_bytes(listing)
    return True
