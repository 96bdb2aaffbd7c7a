"""Benchmark worlds: offline corpora with generated QA sets (FactbookQA, elements, cities, dictionary, notes).

`registry` lists them; `pipeline` holds what every build shares.
"""
