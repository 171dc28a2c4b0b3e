"""PyInstaller entry point: the frozen app runs `slotkeeper.cli:main` (like the console script)."""

from slotkeeper.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
