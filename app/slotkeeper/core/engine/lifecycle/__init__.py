"""llama-server's life: the launch plan, the launcher, the leftover of a crash, the server link,
the model's facts and the event loop everything runs on."""
