"""Everything that runs without Qt (enforced by an import-linter contract)."""
