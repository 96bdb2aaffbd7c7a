"""The club world: a rowing club member's Markdown notes, the notes world's sibling."""
