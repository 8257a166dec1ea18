"""The requests a calibration sends (pure): distinct prompts of about the asked length, and their bodies.

- **Distinct prompts.** Every request's prompt starts with its own number, so no two share a first KV block and
  vLLM's prefix cache cannot serve one from another's: each request's prompt is computed, as real traffic's would be
  (a measurement on one repeated prompt would count its prefill as free).
- **About P tokens.** The calibration does not know the backend's tokenizer. Prompts are words; the first warm-up
  request sends P words, the backend's ``usage.prompt_tokens`` says how many tokens that made, and the steps use
  ``words_for`` that many words. What each request really carried is counted from its usage, never assumed.
- **O tokens out.** ``max_tokens`` = O, and vLLM's ``ignore_eos: true`` where the backend accepts it (the warm-up
  finds out): a model, a random tiny one above all, may otherwise stop at an end-of-sequence token long before O.
- **Streaming**, with ``stream_options.include_usage`` (the last chunk carries the token counts), on
  ``/v1/completions``: a plain prompt, no chat template adding tokens of its own.
"""

from __future__ import annotations

import random
from typing import Any

COMPLETIONS_PATH = "/v1/completions"
WORDS = (
    "the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all",
    "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their",
    "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would",
    "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way",
    "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long",
    "down", "day", "did", "get", "come", "made", "may", "part",
)


def prompt(index: int, words: int) -> str:
    """Request ``index``'s prompt: its number, then ``words`` - 1 words drawn with ``index`` as the seed."""
    draw = random.Random(index)
    return " ".join([str(index), *(draw.choice(WORDS) for _ in range(words - 1))])


def words_for(prompt_tokens: int, words_sent: int, tokens_seen: int) -> int:
    """The words of a prompt of about ``prompt_tokens`` tokens, given that ``words_sent`` words made ``tokens_seen``
    (at least 1; ``words_sent`` again when the backend counted no token)."""
    if tokens_seen <= 0:
        return words_sent
    return max(1, round(words_sent * prompt_tokens / tokens_seen))


def body(model: str, text: str, output_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    """A streamed completion of exactly ``output_tokens`` tokens where ``ignore_eos`` is honoured."""
    out: dict[str, Any] = {"model": model, "prompt": text, "max_tokens": output_tokens, "stream": True,
                           "stream_options": {"include_usage": True}}
    if ignore_eos:
        out["ignore_eos"] = True
    return out
