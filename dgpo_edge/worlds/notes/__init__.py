"""The notes world: a generated folder of personal Markdown notes with cross-references."""
