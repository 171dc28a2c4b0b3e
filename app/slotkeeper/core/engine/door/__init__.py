"""The front door: the HTTP face clients talk to, what a request is (its endpoint, shape and
prompt tokens) and the translations of the agent APIs into chat."""
