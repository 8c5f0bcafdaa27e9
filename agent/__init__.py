"""The computer-use agent: screenshot, planner, grounder, action, repeat.

Not built yet: see the agent issue. Nothing here is used by the service today.
"""
