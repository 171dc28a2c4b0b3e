"""The chat model every API is read as: the agent APIs' bodies (Anthropic Messages, OpenAI
Responses) as the chat completions llama-server converts them to, and a chat answer written back
as a Messages answer. Pure, below the engine and the sessions, so both may stand on it."""
