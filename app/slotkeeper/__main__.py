"""`python -m slotkeeper` and the `slotkeeper` command: `serve` gets its head start
(core/server/headstart.py) before the command line module and the rest are imported."""

import sys


def main() -> int:
    if "serve" in sys.argv[1:]:  # other commands do not even import it
        from slotkeeper.core.server import headstart

        headstart.begin(sys.argv[1:])
    from slotkeeper.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
