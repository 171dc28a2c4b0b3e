"""The command line: `slotkeeper [serve|model-info|sessions|models] ...`. ``commands`` holds the
command table (the parser, the dispatch and the head start read it); each command's code is
imported only when it runs, and Qt only for the desktop app."""
