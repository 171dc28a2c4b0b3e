"""The slots: the board holding one sealed record per slot, the actions on a slot (save, restore,
restore points), the autosave rules, the poller and the restore rates."""
