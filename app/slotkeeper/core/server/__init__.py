"""llama-server: locating, command line, supervision, restart policy."""
