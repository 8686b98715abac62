"""Token log-probs in OpenAI's shapes: chat's `logprobs.content[]` and the legacy completions'
`logprobs` (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

The values are the engine's (docs/api.md says which distribution). A token's text is the
tokenizer's decoding of that one token, as vLLM shows it; a token that is part of a multi-byte
character decodes to U+FFFD on its own. The entries cover every generated token counted in
`usage.completion_tokens`, the tokens of a stop word that ended the answer included (its text is
cut from the output, not from the log-probs). With `echo` the prompt's tokens come first, the
first of them with a null log-prob and null top log-probs (vLLM's and OpenAI's shape).
"""

from __future__ import annotations

from typing import Any

from tritonbox_api.service.running import TokenLogprob

# vLLM's floor for a log-prob it shows: a token a guide or a bad word banned has -inf, which
# JSON cannot carry (a guided answer's top alternatives often include such tokens).
MIN_LOGPROB = -9999.0


def _shown(logprob: float | None) -> float | None:
    """A log-prob as JSON can carry it: a token the guide ruled out (-inf) as MIN_LOGPROB; None
    (the prompt's first token, with echo) stays None."""
    return None if logprob is None else max(logprob, MIN_LOGPROB)


class LogprobShape:
    """Formats the log-probs of one answer, a slice at a time when streaming."""

    def __init__(self, tokenizer: Any, *, chat: bool, top: int) -> None:
        self._tokenizer = tokenizer
        self._chat = chat
        self._top = top
        self._texts: dict[int, str] = {}
        self._offset = 0  # completions' text_offset of the next token

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = str(self._tokenizer.decode([token]))
        return text

    def _chat_entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        text = self._text(token)
        return {"token": text, "logprob": _shown(logprob), "bytes": list(text.encode())}

    def part(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        """The `logprobs` object of a choice (or a chunk's choice) for these tokens."""
        if self._chat:
            content = []
            for token, logprob, top in entries:
                entry = self._chat_entry(token, logprob)
                ids, values = top or ([], [])
                entry["top_logprobs"] = [
                    self._chat_entry(i, v) for i, v in zip(ids[: self._top], values, strict=False)
                ]
                content.append(entry)
            return {"content": content, "refusal": None}
        tokens, offsets = [], []
        tops: list[dict[str, float] | None] = []
        for token, logprob, top in entries:
            text = self._text(token)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            if logprob is None:  # the prompt's first token (echo): nothing came before it
                tops.append(None)
                continue
            ids, values = top or ([], [])
            # OpenAI's legacy rule: the N best, and the chosen token's too when not among them.
            best = {
                self._text(i): max(v, MIN_LOGPROB)
                for i, v in zip(ids[: self._top], values, strict=False)
            }
            best.setdefault(text, max(logprob, MIN_LOGPROB))
            tops.append(best)
        return {
            "tokens": tokens,
            "token_logprobs": [_shown(logprob) for _, logprob, _ in entries],
            "top_logprobs": tops,
            "text_offset": offsets,
        }
