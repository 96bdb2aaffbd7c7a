"""The OpenAI chat-completions shapes for the agent: request checks, responses, stream chunks.

The agent answers one question with its own searches, so of a request's
`messages` only the last one, which must be the user's, is the question
(earlier turns are not fed to the model: the protocol has no place for them).
The answer is the message `content` (empty when the agent gave none; then
`finish_reason` is "length"). What the agent did comes along in the extra
top-level field `dgpo_edge` (see `extra_json`), and in a stream its text, searches and
retrieved passages arrive as `delta.reasoning_content` before the answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from ..retrieval.server import ClientError, check_unicode, _json_type
from .events import AgentResult, Answered, Failed, PassagesRetrieved, TokenDelta

MAX_QUESTION_CHARS = 4000


@dataclass(frozen=True)
class ChatRequest:
    """A validated `/v1/chat/completions` body."""

    question: str
    stream: bool = False
    include_usage: bool = False
    temperature: float = 0.0
    seed: int | None = None


def parse_chat_request(data: Any) -> ChatRequest:
    """Check a decoded body; ClientError(400) names the field that is wrong.

    Only `temperature` and `seed` reach the sampler; `top_p`, `max_tokens` and a `top_k`
    field (sampling top-k in other servers' dialects, `Sampling.top_k_tokens` here) are
    ignored, so a client's `top_k` never changes the passages per search (`--top-k`)."""
    if not isinstance(data, dict):
        raise ClientError(400, "the body must be a JSON object with a 'messages' list")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClientError(400, "'messages' must be a non-empty list")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ClientError(400, "the last message must have role 'user': it is the question")
    question = _text(last.get("content"))
    if not question.strip():
        raise ClientError(400, "the question (the last user message) is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise ClientError(400, f"the question is too long: {len(question)} > {MAX_QUESTION_CHARS} characters")
    check_unicode(question, "the question")   # a "\\ud800" escape: the engine's encoder would fail (a 500)
    if data.get("n", 1) != 1:
        raise ClientError(400, "'n' must be 1: the agent gives one answer")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ClientError(400, f"'stream_options' must be an object, not {_json_type(options)}")
    return ChatRequest(question, _bool(data, "stream"), _bool(options, "include_usage"),
                       _temperature(data.get("temperature")), _seed(data.get("seed")))


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ClientError(400, "only text content parts are supported")
            parts.append(part["text"])
        return "\n".join(parts)
    raise ClientError(400, f"the message 'content' must be a string or a list of text parts, "
                           f"not {_json_type(content)}")


def _bool(data: dict, key: str) -> bool:
    value = data.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ClientError(400, f"'{key}' must be true or false, not {_json_type(value)}")
    return value


def _temperature(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise ClientError(400, "'temperature' must be a number in 0..2")
    return float(value)


def _seed(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ClientError(400, f"'seed' must be an integer, not {_json_type(value)}")
    if value is not None and value < 0:   # a sampler seeds with none below 0: a 400, not a failed run's 500
        raise ClientError(400, f"'seed' must be 0 or more, not {value}")
    return value


# --- what the agent did ----------------------------------------------------------------------------

class Trace:
    """Follows one run's events: the searches with their passages, and the end event."""

    def __init__(self) -> None:
        self.searches: list[dict[str, Any]] = []
        self.end: Answered | Failed | None = None

    def add(self, event: Any) -> str:
        """Record `event`; return its reasoning text for a stream ('' for none)."""
        if isinstance(event, TokenDelta):
            return event.text
        if isinstance(event, PassagesRetrieved):
            hits = [_passage(p) for p in event.passages]
            self.searches.append({"query": event.query, "passages": hits, "ms": round(event.retrieval_ms, 1)})
            lines = "".join(f"  [{i}] {h['title']} ({h['id']})\n" for i, h in enumerate(hits, start=1))
            return f"\nsearched: {event.query}\n{lines}"
        if isinstance(event, (Answered, Failed)):
            self.end = event
        return ""

    @property
    def result(self) -> AgentResult:
        assert self.end is not None, "the run has not ended"
        return self.end.result

    @property
    def error(self) -> str | None:
        """The engine or retriever failure that ended the run, if one did."""
        if isinstance(self.end, Failed) and self.result.stop_reason == "error":
            return self.end.reason
        return None

    @property
    def finish_reason(self) -> str:
        return "stop" if self.result.answer is not None else "length"


def _passage(p: Any) -> dict[str, Any]:
    score = p.score if p.score is not None and math.isfinite(p.score) else None
    return {"id": p.id, "title": p.title, "score": score}


def extra_json(trace: Trace) -> dict[str, Any]:
    """The `dgpo_edge` field: searches (query, passages id/title/score, ms), sources (every passage
    shown, with text), cited ids (sources that contain the answer), stop reason, timings."""
    r = trace.result
    return {"searches": trace.searches,
            "sources": [{"id": p.id, "title": p.title, "text": p.text} for p in r.passages],
            "cited": [p.id for p in r.cited], "stop_reason": r.stop_reason,
            "failure": None if isinstance(trace.end, Answered) else trace.end.reason,  # type: ignore[union-attr]
            "invalid_actions": r.invalid_actions, "timings": dataclasses.asdict(r.timings)}


def usage_json(r: AgentResult) -> dict[str, int]:
    """Tokens generated are the completion; the prompt and information blocks are the prompt."""
    t = r.timings
    return {"prompt_tokens": max(t.transcript_tokens - t.new_tokens, 0), "completion_tokens": t.new_tokens,
            "total_tokens": t.transcript_tokens}


def completion_json(trace: Trace, cid: str, created: int, model: str) -> dict[str, Any]:
    """A whole `chat.completion` object."""
    r = trace.result
    message = {"role": "assistant", "content": r.answer or ""}
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": trace.finish_reason}],
            "usage": usage_json(r), "dgpo_edge": extra_json(trace)}


def chunk_json(cid: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               **extra: Any) -> dict[str, Any]:
    """One `chat.completion.chunk`."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}


def error_json(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error shape, which its clients read into the exception message."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event line pair."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"
