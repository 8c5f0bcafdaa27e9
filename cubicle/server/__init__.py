"""Everything `cubicle serve` runs: the app, API, manager, pool, runtimes, live view, board,
evaluations and MCP room."""
