"""The Search-R1 / DGPO agent protocol, as pure functions on strings.

Released checkpoints (Search-R1, omron-sinicx/DGPO-qwen2.5-0.5b) were trained on
one exact prompt and observation format, so every string here reproduces
Search-R1's `scripts/data_process/qa_search_*.py` and
`search_r1/llm_agent/generation.py` byte for byte (typo "as your want" included).

Beyond Search-R1, retrieved text is treated as data: `escape_tags` neutralises
anything in a passage that a parser or tokenizer could read as a protocol tag or
a special token, so a passage can neither close the information block early nor
be scored as the model's answer (Search-R1 scores the last `<answer>` anywhere in
prompt + response).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .lru import LRU

# --- the strings released checkpoints were trained on -------------------------

PROMPT_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)

INVALID_ACTION_FEEDBACK = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

#: A turn ends at the first of these (they stay in the turn's text).
STOP_STRINGS: tuple[str, ...] = ("</search>", "</answer>")

#: Tags the protocol gives meaning to.
TAGS: tuple[str, ...] = ("think", "search", "answer", "information")

_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


#: The most a person may ask of the agent's search settings: `--top-k` and `--max-searches` of
#: ask, chat, eval and serve, and the chat's settings screen. Generous: under the default budgets
#: (500 tokens an observation, 4,096 an episode) more would be cut off before the model read them.
MAX_TOP_K = 20
MAX_SEARCHES = 16


@dataclass(frozen=True)
class ProtocolConfig:
    """Episode limits. Defaults are DGPO's (its `topk=3`, and `max_turns=4`, which counts the
    searches, as `max_searches` does here; 500/500/4096 tokens)."""

    top_k: int = 3                 # passages per search
    max_searches: int = 4          # search turns before the final, search-free turn
    max_turn_tokens: int = 500     # new tokens per generated turn
    max_obs_tokens: int = 500      # tokens per information block
    max_total_tokens: int = 4096   # prompt + everything appended

    def __post_init__(self) -> None:
        for name in ("top_k", "max_turn_tokens", "max_obs_tokens", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_searches < 0:
            raise ValueError(f"max_searches must be >= 0, got {self.max_searches}")


# --- prompt --------------------------------------------------------------------

def normalize_question(question: str) -> str:
    """Strip and append '?' when missing, as Search-R1's data scripts do."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    return q if q.endswith("?") else q + "?"


def user_message(question: str) -> str:
    """The single user turn: the instruction with the question filled in."""
    return PROMPT_TEMPLATE.format(question=normalize_question(question))


def render_prompt(question: str, chat_template: Any | None = None) -> str:
    """The full prompt text the model continues.

    `chat_template` is anything with `apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)` (a transformers tokenizer, or our
    `chat_template.ChatTemplate`); None gives the raw instruction, which is what
    Search-R1 feeds a tokenizer without a template.
    """
    message = user_message(question)
    if chat_template is None:
        return message
    return chat_template.apply_chat_template(
        [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True)


# --- actions -------------------------------------------------------------------

@dataclass(frozen=True)
class Action:
    """What one generated turn asks for: a search, an answer, or nothing valid."""

    kind: Literal["search", "answer", "invalid"]
    content: str = ""


def truncate_turn(text: str) -> str:
    """Cut a turn after its first `</search>`, else after its first `</answer>`.

    Search-R1 gives `</search>` precedence even when `</answer>` comes first; we
    keep that so post-processing of un-stopped generations matches exactly.
    """
    if "</search>" in text:
        return text.split("</search>", 1)[0] + "</search>"
    if "</answer>" in text:
        return text.split("</answer>", 1)[0] + "</answer>"
    return text


def parse_action(turn_text: str) -> Action:
    """The first `<search>…</search>` or `<answer>…</answer>` of one turn's text.

    Only ever call this on generated text: forced text (prompt, information,
    feedback) must never be parsed for actions.
    """
    m = _ACTION_RE.search(turn_text)
    if m is None:
        return Action("invalid")
    return Action(m.group(1), m.group(2).strip())  # type: ignore[arg-type]


def extract_answer(generated_texts: Iterable[str]) -> str | None:
    """The last `<answer>…</answer>` in the generated segments, stripped.

    Unlike Search-R1's scorer (which scans prompt + response and therefore has to
    skip the example answer in the prompt), this only looks at generated text.
    """
    answer = None
    for text in generated_texts:
        for m in _ANSWER_RE.finditer(text):
            answer = m.group(1).strip()
    return answer


# --- tag escaping ---------------------------------------------------------------

# After NFKC folding, "<" followed by optional "/" and a protocol tag name, or
# "<|" (the start of a special token such as <|im_end|>).
_TAG_LIKE = re.compile(r"<\s*/?\s*(?:" + "|".join(TAGS) + r")|<\s*\|", re.IGNORECASE)
_ESCAPED_LT = "&lt;"


def _folds_to_lt(ch: str) -> bool:
    return ch == "<" or "<" in unicodedata.normalize("NFKC", ch)


def escape_tags(text: str) -> str:
    """Neutralise tag-like text in retrieved passages.

    Every character that is, or NFKC-folds to, '<' and starts something that
    folds to a protocol tag (`<answer`, `</ information`, fullwidth `＜answer`…)
    or a special token (`<|im_end|>`) is replaced by '&lt;'. Other '<'
    characters (maths, arrows) are left alone. The result contains no protocol
    tag and no special-token opener, even after NFKC normalisation.
    """
    # Each distinct character is checked once (passages are long, their alphabets short).
    if not any(_folds_to_lt(c) for c in set(text)):
        return text
    out = []
    for i, ch in enumerate(text):
        if _folds_to_lt(ch):
            # Fold a window wide enough for "</ information" plus spacing.
            window = unicodedata.normalize("NFKC", text[i:i + 32])
            window = "<" + window[window.index("<") + 1:] if "<" in window else window
            if _TAG_LIKE.match(window):
                out.append(_ESCAPED_LT)
                continue
        out.append(ch)
    escaped = "".join(out)
    # Removing one opener can expose another across a fold boundary only in
    # pathological compositions; iterate to a fixed point to be sure.
    return escaped if escaped == text else escape_tags(escaped)


# --- passages and the information block -----------------------------------------

@dataclass(frozen=True)
class Passage:
    """One retrieved passage in the Search-R1 corpus form: `"Title"\\ntext`."""

    id: str
    contents: str
    score: float | None = None

    @property
    def raw_title(self) -> str:
        """The first line of `contents`, quotes kept (what the model sees)."""
        return self.contents.split("\n", 1)[0]

    @property
    def title(self) -> str:
        """The title for display: the first line without its surrounding quotes."""
        t = self.raw_title.strip()
        return t[1:-1] if len(t) >= 2 and t[0] == t[-1] == '"' else t

    @property
    def text(self) -> str:
        return self.contents.split("\n", 1)[1] if "\n" in self.contents else ""

    @classmethod
    def from_search_r1(cls, item: dict) -> Passage:
        """From one element of a `/retrieve` result (with or without scores)."""
        doc = item.get("document", item)
        return cls(str(doc["id"]), doc["contents"], item.get("score"))


def format_docs(passages: Sequence[Passage]) -> str:
    """`Doc {i}(Title: {first line}) {rest}\\n` per passage, tag-escaped.

    Byte-identical to Search-R1's `_passages2string` for passages without
    tag-like text: the title keeps its quotes and there is no space before '('.
    """
    return "".join(
        f"Doc {i}(Title: {escape_tags(p.raw_title)}) {escape_tags(p.text)}\n"
        for i, p in enumerate(passages, start=1))


def information_block(passages: Sequence[Passage], max_tokens: int | None = None,
                      count_tokens: Callable[[str], int] | None = None) -> str:
    """The observation appended after a search: `\\n\\n<information>…</information>\\n\\n`.

    Search-R1 truncates the observation's *token ids* to 500, which can cut the
    closing tag off. Here the docs text is shortened instead, so the block always
    closes and fits `max_tokens` as counted by `count_tokens`.
    """
    docs = format_docs(passages).strip()
    return _wrap(docs[:_fitting_length(docs, max_tokens, count_tokens)].rstrip())


def _fitting_length(docs: str, max_tokens: int | None, count_tokens: Callable[[str], int] | None) -> int:
    """The longest prefix of `docs` whose block fits (a binary search: about a dozen tokenizations)."""
    if max_tokens is None or count_tokens is None:
        return len(docs)
    return _fitting_lengths([docs], max_tokens, lambda texts: [count_tokens(t) for t in texts])[0]


def _fitting_lengths(docs: Sequence[str], max_tokens: int, count_many: Callable[[list[str]], list[int]]) -> list[int]:
    """`_fitting_length` of many docs texts at once: the same binary searches, run side by side, so
    that each round's candidate blocks are counted in one `count_many` call (a tokenizer's batch
    encoder tokenizes them in parallel) and every search probes exactly what it would alone."""
    whole = count_many([_wrap(d) for d in docs])
    lo = [len(d) if n <= max_tokens else 0 for d, n in zip(docs, whole)]   # a whole block that fits is done
    hi = [len(d) for d in docs]
    while True:
        open_ = [i for i in range(len(docs)) if lo[i] < hi[i]]
        if not open_:
            break
        mids = {i: (lo[i] + hi[i] + 1) // 2 for i in open_}
        counts = count_many([_wrap(docs[i][:mids[i]].rstrip()) for i in open_])
        for i, n in zip(open_, counts):
            if n <= max_tokens:
                lo[i] = mids[i]
            else:
                hi[i] = mids[i] - 1
    return lo


class InformationBlocks:
    """`information_block` for one token counter, remembering how much of each docs text fits.

    Shortening a long block tokenizes it about a dozen times; RL shows the same passages again and
    again (the same questions every epoch, the same searches for one question), and on FactbookQA
    that tokenizing was most of a rollout's host time. The memory holds, for the last `size`
    distinct (docs text, max_tokens), the length that fits, keyed by a 128-bit BLAKE2b digest of
    the text, so a remembered block is the one `information_block` builds. `many` (and `prefetch`)
    fits many passage lists at once (a rollout's searches of one round), counting through `encode_many` when
    given: a batch encoder whose ids' lengths are what `count_tokens` counts (the rollouts also
    encode a round's blocks with it); otherwise through `count_tokens` one text at a time.
    """

    def __init__(self, count_tokens: Callable[[str], int], size: int = 65536,
                 encode_many: Callable[[list[str]], list[list[int]]] | None = None):
        self.count_tokens = count_tokens
        self.encode_many = encode_many
        if encode_many is not None:
            self.count_many: Callable[[list[str]], list[int]] = lambda texts: [len(x) for x in encode_many(texts)]
        else:
            self.count_many = lambda texts: [count_tokens(t) for t in texts]
        self._fits: LRU[tuple[bytes, int | None], int] = LRU(size)
        self.hits = self.misses = 0

    def __call__(self, passages: Sequence[Passage], max_tokens: int | None) -> str:
        return self._block(*self._docs_and_key(passages, max_tokens), max_tokens)

    def many(self, passage_lists: Iterable[Sequence[Passage]], max_tokens: int | None) -> list[str]:
        """The block of each passage list, as calls one by one give them, with the lists not yet in
        memory fitted together first (`prefetch`); each list's text is formatted once."""
        items = [self._docs_and_key(passages, max_tokens) for passages in passage_lists]
        self._fit_new(items, max_tokens)
        return [self._block(docs, key, max_tokens) for docs, key in items]

    def prefetch(self, passage_lists: Iterable[Sequence[Passage]], max_tokens: int | None) -> None:
        """Fit every passage list not yet in memory, all in one batched search, so that the calls for
        them that follow are answered from memory (`misses` counts the lists fitted, here or in a
        call; `hits` the calls answered from memory). A memory smaller than one round's distinct
        lists forgets some before they are asked for: those calls fit them again, one at a time."""
        self._fit_new([self._docs_and_key(passages, max_tokens) for passages in passage_lists], max_tokens)

    def _block(self, docs: str, key: tuple[bytes, int | None], max_tokens: int | None) -> str:
        length = self._fits.get(key)
        if length is None:
            self.misses += 1
            length = _fitting_length(docs, max_tokens, self.count_tokens)
            self._fits.put(key, length)
        else:
            self.hits += 1
        return _wrap(docs[:length].rstrip())

    def _fit_new(self, items: list[tuple[str, tuple[bytes, int | None]]], max_tokens: int | None) -> None:
        todo: dict[tuple[bytes, int | None], str] = {}
        for docs, key in items:
            if key not in todo and self._fits.get(key) is None:
                todo[key] = docs
        if not todo:
            return
        if max_tokens is None:
            lengths = [len(d) for d in todo.values()]
        else:
            lengths = _fitting_lengths(list(todo.values()), max_tokens, self.count_many)
        for key, length in zip(todo, lengths):
            self._fits.put(key, length)
        self.misses += len(todo)

    @staticmethod
    def _docs_and_key(passages: Sequence[Passage], max_tokens: int | None) -> tuple[str, tuple[bytes, int | None]]:
        docs = format_docs(passages).strip()
        return docs, (hashlib.blake2b(docs.encode("utf-8"), digest_size=16).digest(), max_tokens)


def _wrap(docs: str) -> str:
    return f"\n\n<information>{docs}</information>\n\n"
