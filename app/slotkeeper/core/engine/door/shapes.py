"""A request as far as its prompt goes (its shape): two requests of one conversation have the same
fixed part, and the later one's growing part (the chat's ``messages``, a text ``prompt``) starts
with the earlier one's. The front desk's fast way in compares shapes instead of tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotkeeper.core.engine.door.endpoints import PROMPT_CHAT, PROMPT_TEXT

# Request fields that change how a reply is sampled, not the prompt: two requests that differ
# only in these (and in a longer conversation) render the same prompt prefix.
SAMPLING_FIELDS = frozenset({
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict", "temperature",
    "dynatemp_range", "dynatemp_exponent", "top_p", "top_k", "min_p", "typical_p", "top_n_sigma", "seed",
    "stop", "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "penalty_last_n",
    "logprobs", "top_logprobs", "n_probs", "post_sampling_probs", "id_slot", "cache_prompt",
    "timings_per_token", "return_progress", "return_tokens", "user", "logit_bias", "mirostat", "mirostat_tau",
    "mirostat_eta", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "samplers", "n", "ignore_eos",
    "t_max_predict_ms", "grammar", "n_keep", "n_indent", "n_discard", "n_cmpl", "lora", "speculative.n_max",
    "speculative.n_min", "speculative.p_min"})


@dataclass(frozen=True)
class RequestShape:
    """A request as far as its prompt goes: the growing part (the chat's ``messages``, a text
    ``prompt``) and everything else that shapes the prompt (tools, template options...)."""

    prompt_kind: str  # PROMPT_CHAT or PROMPT_TEXT
    growing: tuple[Any, ...] | str
    fixed: dict[str, Any]

    def continues(self, before: RequestShape) -> bool:
        """This request's prompt starts with all of ``before``'s (a next turn, a longer text)."""
        if self.prompt_kind != before.prompt_kind or self.fixed != before.fixed:
            return False
        if isinstance(self.growing, str):
            return isinstance(before.growing, str) and self.growing.startswith(before.growing)
        n = len(before.growing)
        return len(self.growing) >= n and self.growing[:n] == before.growing

    @property
    def length(self) -> int:
        return len(self.growing)


def request_shape(prompt_kind: str, body: dict[str, Any]) -> RequestShape | None:
    """The shape of a chat (``messages``) or text-completion (string ``prompt``) request."""
    key = "messages" if prompt_kind == PROMPT_CHAT else "prompt"
    growing = body.get(key)
    if prompt_kind == PROMPT_CHAT and isinstance(growing, list) and growing:
        growing = tuple(growing)
    elif not (prompt_kind == PROMPT_TEXT and isinstance(growing, str) and growing):
        return None
    return RequestShape(prompt_kind, growing,
                        {k: v for k, v in body.items() if k != key and k not in SAMPLING_FIELDS})


@dataclass(frozen=True)
class PromptSource:
    """What renders a request's prompt: its kind and the fields that shape it. A slot keeps one to
    learn its tokens later (the fast way in) and one of its last request (restore points ask where
    its last user message starts)."""

    prompt_kind: str | None
    body: dict[str, Any]
