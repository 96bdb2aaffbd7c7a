"""Trajectory files -> token ids with loss masks, and batches of them.

A trajectory row (FactbookQA `oracle.jsonl`, or `train tgo` output) is
`{"id", "question", "golden_answers", "segments": [...]}` where segments are
`Transcript.to_dict()` segments *after* the prompt (turn / information /
feedback). The prompt depends on the model's chat template, so it is rendered
here with the tokenizer being trained. Token ids come from
`Transcript.tokenize`: each segment encoded on its own (a turn keeps the ids
the teacher sampled when the row has them), mask 1 on generated turns only, so
information and feedback tokens never carry loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgpo_edge import protocol
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import read_jsonl
from dgpo_edge.metrics import exact_match
from dgpo_edge.transcript import Transcript, encoder_for

SEGMENT_KINDS = ("turn", "information", "feedback")


def require_data_files(data: Any) -> None:
    """Every file the `data` section names (train, dev, report) is there, checked before any model
    loads (a KD run loads its teacher first), naming the key of the one that is not."""
    from dgpo_edge.jsonio import require_file

    for key in ("train", "dev", "report"):
        path = getattr(data, key, None)
        if path:
            try:
                require_file(path)
            except InputError as e:
                raise InputError(f"data.{key}: {e.message}", e.path) from None


def check_trajectory_rows(path: str | Path, limit: int | None) -> None:
    """The rows load_trajectories will read (the first `limit`) are trajectories, checked without a
    tokenizer before any model loads: a malformed line, a QA file given as data.train or an empty
    file was named only once the model (and a KD run's teacher) had loaded."""
    path = Path(path)
    if not sum(1 for _ in _rows(path, limit, None)):   # every row read, so that a bad one is named
        raise InputError("data.train: no trajectories in this file", path)


Row = tuple[int, dict, Transcript, tuple[str, ...]]   # line, row, its transcript, its gold answers


def _rows(path: Path, limit: int | None, template: Any, tokenizer: Any = None) -> Iterator[Row]:
    """The first `limit` rows as (line, row, transcript, gold answers), each checked (InputError names
    the file and line): the check before loading and the loading read rows through this one loop,
    so that what the first passes the second takes."""
    for n, (line, row) in enumerate(read_jsonl(path)):
        if limit is not None and n >= limit:
            break
        yield line, row, transcript_from_row(row, path, line, template, tokenizer), _answers(row, path, line)


@dataclass
class Example:
    """One tokenized trajectory."""

    id: str
    ids: list[int]
    mask: list[int]          # 1 on generated (turn) tokens
    prompt_len: int          # leading forced tokens (for on-policy sampling)
    answers: tuple[str, ...] = ()


@dataclass
class LoadStats:
    rows: int = 0
    kept: int = 0
    wrong_answer: int = 0    # dropped by only_correct
    too_long: int = 0        # dropped by max_length
    tokens: int = 0
    loss_tokens: int = 0
    extra: dict = field(default_factory=dict)


def transcript_from_row(row: dict[str, Any], path: Path, line: int, chat_template: Any | None,
                        tokenizer: Any | None = None) -> Transcript:
    """Rebuild the Transcript of one row, validating its fields.

    Sampled `token_ids` of a turn are kept only when `tokenizer` decodes them back to the
    turn's text: ids from another tokenizer (SeqKD across model families) are dropped, and
    the text is encoded instead.
    """
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError("missing or empty 'question'", path, line)
    segments = row.get("segments")
    if not isinstance(segments, list) or not segments:
        raise InputError("missing 'segments' (a non-empty list)", path, line)
    if isinstance(segments[0], dict) and segments[0].get("kind") == "prompt":
        segments = segments[1:]  # re-rendered below with this model's template
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or seg.get("kind") not in SEGMENT_KINDS or not isinstance(seg.get("text"), str):
            raise InputError(f"segment {i} must be an object with 'kind' in {SEGMENT_KINDS} and a 'text'",
                             path, line)
    if tokenizer is not None:
        segments = [_check_ids(seg, tokenizer) for seg in segments]
    prompt = protocol.render_prompt(question, chat_template)
    try:
        return Transcript.from_dict({"question": question,
                                     "segments": [{"kind": "prompt", "text": prompt}, *segments]})
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"bad segment ({e})", path, line) from None


def _check_ids(seg: dict, tokenizer: Any) -> dict:
    ids = seg.get("token_ids")
    if ids is None:
        return seg
    ok = isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < len(tokenizer) for i in ids)
    if ok and tokenizer.decode(ids) == seg["text"]:
        return seg
    return {k: v for k, v in seg.items() if k != "token_ids"}


def load_trajectories(path: str | Path, tokenizer: Any, *, max_length: int, only_correct: bool = True,
                      chat_template: bool = True, limit: int | None = None) -> tuple[list[Example], LoadStats]:
    """Tokenize every usable trajectory in `path`; InputError names the file and line of a bad row."""
    path = Path(path)
    encode = encoder_for(tokenizer)
    template = tokenizer if chat_template and getattr(tokenizer, "chat_template", None) else None
    examples: list[Example] = []
    stats = LoadStats()
    for line, row, t, golds in _rows(path, limit, template, tokenizer):
        stats.rows += 1
        if only_correct and not exact_match(t.answer(), golds):
            stats.wrong_answer += 1
            continue
        tok = t.tokenize(encode)
        if len(tok.ids) > max_length:
            stats.too_long += 1
            continue
        examples.append(Example(str(row.get("id", line)), tok.ids, tok.mask, tok.prompt_length, golds))
        stats.kept += 1
        stats.tokens += len(tok.ids)
        stats.loss_tokens += sum(tok.mask)
    if not examples:
        raise InputError(f"no usable trajectories ({stats.rows} rows, {stats.wrong_answer} with a wrong "
                         f"answer, {stats.too_long} longer than max_length={max_length})", path)
    return examples, stats


def _answers(row: dict, path: Path, line: int) -> tuple[str, ...]:
    golds = row.get("golden_answers", [])
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not all(isinstance(g, str) for g in golds):
        raise InputError("'golden_answers' must be a list of strings", path, line)
    return tuple(golds)


def collate(examples: list[Example], pad_id: int) -> dict[str, Any]:
    """Right-padded tensors: input_ids, attention_mask, and target_mask.

    target_mask[b, i] = 1 when position i's prediction (of token i + 1) is a
    generated token, i.e. the next-token loss at i counts.
    """
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    target = torch.zeros((len(examples), width), dtype=torch.float32)
    for b, e in enumerate(examples):
        n = len(e.ids)
        ids[b, :n] = torch.tensor(e.ids)
        attn[b, :n] = 1
        target[b, :n - 1] = torch.tensor(e.mask[1:], dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "target_mask": target}


def batch_order(n_examples: int, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
    """Example indices per global micro-batch for one epoch; the same for every process and on resume."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n_examples, generator=g).tolist()
    return [perm[i:i + batch_size] for i in range(0, n_examples - batch_size + 1, batch_size)] or [perm]


def report_data(accelerator: Any, path: str, stats: Any) -> None:
    if accelerator.is_main_process:
        print(f"{path}: {stats.kept:,} of {stats.rows:,} trajectories ({stats.wrong_answer} wrong answer, "
              f"{stats.too_long} too long); {stats.tokens:,} tokens, {stats.loss_tokens:,} with loss")
