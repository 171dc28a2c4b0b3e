"""How fast this machine prefills and restores, measured as it goes: the break-even of a restore
(a saved conversation is brought back only when reading its file is quicker than prefilling what
it would spare). The slot actions measure restores, the front desk prefills; the desk reads both."""

from __future__ import annotations

DEFAULT_PREFILL_TOKENS_PER_MS = 0.5  # until measured on this machine and model
DEFAULT_RESTORE_BYTES_PER_MS = 1_000_000.0  # ~1 GB/s, until measured
RESTORE_OVERHEAD_MS = 20.0
RATE_WEIGHT = 0.2  # exponential moving average of the measured rates
MIN_MEASURED_PREFILL = 64  # tokens: a shorter prefill says more about overhead than speed


class Rates:
    def __init__(self) -> None:
        self.prefill_tokens_per_ms = DEFAULT_PREFILL_TOKENS_PER_MS
        self.restore_bytes_per_ms = DEFAULT_RESTORE_BYTES_PER_MS

    def restore_measured(self, restore_ms: float, n_read: int) -> None:
        """A restore read ``n_read`` bytes in ``restore_ms``."""
        if restore_ms > 0 and n_read > 0:
            self.restore_bytes_per_ms = _ema(self.restore_bytes_per_ms, n_read / restore_ms)

    def prefill_measured(self, prompt_ms: float, prompt_n: int) -> None:
        """llama-server prefilled ``prompt_n`` tokens in ``prompt_ms``."""
        if prompt_n >= MIN_MEASURED_PREFILL and prompt_ms > 0:
            self.prefill_tokens_per_ms = _ema(self.prefill_tokens_per_ms, prompt_n / prompt_ms)

    def break_even_tokens(self, size_bytes: int) -> int:
        """Prefill tokens that take as long as restoring a file of ``size_bytes``."""
        restore_ms = RESTORE_OVERHEAD_MS + size_bytes / self.restore_bytes_per_ms
        return int(restore_ms * self.prefill_tokens_per_ms)

    def saved_ms(self, cache_n: int) -> float:
        """Prefill time ``cache_n`` tokens from the cache spared."""
        return cache_n / self.prefill_tokens_per_ms if cache_n else 0.0


def _ema(old: float, new: float) -> float:
    return (1 - RATE_WEIGHT) * old + RATE_WEIGHT * new
