"""Benchmark worlds: offline corpora with generated QA sets (FactbookQA)."""
