"""Plug-ins of each kind, as a user writes them, for the end-to-end tests that name them."""
