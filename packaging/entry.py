"""PyInstaller entry point: the frozen app runs `slotkeeper.__main__:main` (like the console script)."""

from slotkeeper.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
