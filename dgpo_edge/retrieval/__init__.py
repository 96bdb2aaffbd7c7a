"""Retrieval: corpus readers, the compressed passage store with BM25, and (later) dense indexes.

`corpus` streams passages from Search-R1/FlashRAG jsonl, folders of documents
(.txt/.md/.pdf/.html, `documents`) and FactbookQA directories; `update` keeps an
index of a folder current; `store` keeps them in one SQLite file
(zstd-compressed text plus an FTS5 BM25 index) whose row i is passage i, so
a FAISS row maps straight onto a store row.
"""
