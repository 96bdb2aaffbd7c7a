"""`dgpo-edge chat`: the Textual terminal app."""
