"""The chat model every API is read as: the agent APIs' bodies (Anthropic Messages, OpenAI
Responses) as the chat completions llama-server converts them to, and a chat answer written back
as a Messages answer. Pure, below the engine and the sessions: the front door routes an agent
request by its chat form and writes the request's transcript from that same chat."""
