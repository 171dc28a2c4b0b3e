"""`python -m slotkeeper` and the `slotkeeper` command: `serve` and the desktop app get their
head start (core/server/headstart.py) before the command line module and the rest are imported."""

import sys

# Commands that never launch llama-server: they do not even import the head start.
NO_LAUNCH = ("model-info", "sessions", "models", "-h", "--help", "--version")


def main() -> int:
    if not any(arg in NO_LAUNCH for arg in sys.argv[1:]):
        from slotkeeper.core.server import headstart

        headstart.begin(sys.argv[1:])
    from slotkeeper.cli.commands import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
