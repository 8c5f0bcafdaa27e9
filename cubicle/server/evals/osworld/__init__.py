"""OSWorld's own harness on Cubicle: its guest HTTP surface per desktop (`surface`), opened
through `/api/desktops/{id}/osworld` (`api`), and a provider for its `DesktopEnv`
(`provider`). Nothing here imports OSWorld's `desktop_env` except `provider`."""
