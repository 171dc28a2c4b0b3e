"""The saved conversations as the engine sees them: the library (listing, budget, prefixes) and the
search index it keeps."""
