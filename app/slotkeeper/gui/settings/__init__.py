"""The Settings dialog and its tabs.

- ``dialog``        SettingsDialog: the tabs, Save / Save and restart, the restart-needed notice
- ``server_tab``    llama-server, the model, context, slots, KV cache, address, extra arguments
- ``sessions_tab``  autosave, restore at launch, start with the app / at login
- ``disk_tab``      the disk budget and what it would delete now
- ``form``          what the tabs share: notes, rows that hide, this run's command-line values
"""
