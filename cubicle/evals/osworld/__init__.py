"""OSWorld's own harness (`DesktopEnv`) on Cubicle desktops."""
