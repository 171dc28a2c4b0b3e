"""The chat window: saved conversations opened, read and continued through the front door."""
