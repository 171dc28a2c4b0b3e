"""Model facts: reading GGUF files, the memory they need, finding, choosing, hashing, fetching and
generating models."""
