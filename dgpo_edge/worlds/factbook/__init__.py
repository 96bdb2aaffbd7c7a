"""FactbookQA: a corpus and multi-hop QA set built from the CIA World Factbook."""
