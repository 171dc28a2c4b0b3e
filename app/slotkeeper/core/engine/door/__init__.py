"""The front door: the HTTP face clients talk to and what a request is (its endpoint, shape and
prompt tokens); the agent APIs are read as chat through core.chat."""
