"""OSWorld-format suites: read one, set a desktop up, check the result.

The service's evaluation runs and `cubicle eval` both use it."""
