"""Evaluation runs on the board, and OSWorld's guest surface, inside the service."""
