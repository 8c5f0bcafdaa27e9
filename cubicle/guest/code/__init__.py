"""Code contexts: Jupyter kernels run inside the desktop as its user (docs/code.md)."""
