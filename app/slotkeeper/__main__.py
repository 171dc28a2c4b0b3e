from slotkeeper.cli import main

raise SystemExit(main())
