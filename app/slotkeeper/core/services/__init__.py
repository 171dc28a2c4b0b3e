"""Services the GUI and the CLI share, so that each policy exists once."""
