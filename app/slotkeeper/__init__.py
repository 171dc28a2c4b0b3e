"""Slotkeeper: keeps a local LLM's KV cache warm across llama-server restarts."""

__version__ = "0.1.0"
