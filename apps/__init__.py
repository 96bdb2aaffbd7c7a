"""Textual apps (the chat TUI). Installed as `dgpo_edge.apps`."""
