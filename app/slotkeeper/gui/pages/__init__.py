"""The main window's tabs, one widget each; every page subscribes to the bridge for what it shows.

- ``server_page``    state, Start/Stop/Restart, model, flags, address, uptime, warnings, the log
- ``slots_page``     one gauge per slot and its legend
- ``history_page``   per-request cache reuse over time
- ``sessions_page``  saved conversations: filter, table, actions, disk usage
"""
