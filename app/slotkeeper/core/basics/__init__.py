"""Platform basics every part stands on: where files live, safe file writes, the data-folder lock,
starting at login, a child's environment, byte sizes, token arrays."""
