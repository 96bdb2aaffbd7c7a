"""dgpo-edge: train a compact search agent (KD + DGPO) and run it offline on a laptop.

The core package is torch-free; `dgpo_edge.train`, `dgpo_edge.export` and
`dgpo_edge.apps` hold the heavier stages and import their own dependencies.
"""

__version__ = "0.1.0"
