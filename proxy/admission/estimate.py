"""n_in, the prompt length in tokens, estimated at admission without a tokenizer.

The estimate only sizes the reservation: at completion the backend's real ``usage.prompt_tokens`` settles the
bucket (``AdmissionController.release`` charges or refunds the difference), so it must be cheap and roughly
right, not exact. The rule (documented in the README as well):

- text: ⌈characters / 4⌉ for ASCII text (the usual ≈4 characters per BPE token of English and code);
  ⌈UTF-8 bytes / 3⌉ otherwise (CJK and other scripts run ≈1 token per character, 3 bytes in UTF-8);
- chat: + 4 tokens per message (role and separators) + 3 for the assistant priming, + the text of ``name``,
  tool-call arguments and the JSON of ``tools``; an image part counts 85 tokens (OpenAI's low-detail tile);
- completions and embeddings (``input`` has the shapes of ``prompt``): a string as text, a list of token ids as
  its length, a batch as the sum;
- responses: ``instructions`` as text; an ``input`` string as one message; an item with ``content`` as a chat
  message; any other item (a tool call, its output, a reasoning item) as its JSON; + the JSON of ``tools`` and
  the assistant priming. What the backend keeps itself (``previous_response_id``, a stored prompt) is not seen:
  the settlement charges it.

Cost: one pass over the strings (``str.isascii`` and ``len`` are C calls); ~1 µs for a typical chat request.
"""

from __future__ import annotations

from typing import Any

PER_MESSAGE_TOKENS = 4
PRIMING_TOKENS = 3
IMAGE_TOKENS = 85


def text_tokens(text: str) -> int:
    if text.isascii():
        return (len(text) + 3) // 4
    return (len(text.encode("utf-8", "surrogatepass")) + 2) // 3


def _json_tokens(value: Any) -> int:
    """Strings as text, every other non-null leaf one token. Iterative: JSON may nest up to orjson's 1024 levels,
    deeper than Python's recursion limit."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += text_tokens(item)
        elif isinstance(item, dict):
            for k, v in item.items():
                total += text_tokens(k) if isinstance(k, str) else 1
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None:
            total += 1
    return total


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += text_tokens(text)
                elif part.get("type") in ("image_url", "input_image", "image"):
                    total += IMAGE_TOKENS
                else:
                    total += _json_tokens(part)
            elif isinstance(part, str):
                total += text_tokens(part)
        return total
    return 0


def chat_prompt_tokens(messages: list[Any], tools: Any = None) -> int:
    total = PRIMING_TOKENS
    for message in messages:
        total += PER_MESSAGE_TOKENS
        if not isinstance(message, dict):
            continue
        total += _content_tokens(message.get("content"))
        name = message.get("name")
        if isinstance(name, str):
            total += text_tokens(name)
        calls = message.get("tool_calls")
        if calls:
            total += _json_tokens(calls)
    if tools:
        total += _json_tokens(tools)
    return total


def completion_prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt, list):
        if not prompt:
            return 0
        if isinstance(prompt[0], int):
            return len(prompt)
        return sum(completion_prompt_tokens(p) for p in prompt)
    return 0


def responses_input_tokens(value: Any, instructions: str | None = None, tools: Any = None) -> int:
    """The Responses API's input: ``instructions`` + ``input`` (a string, or an array of items) + ``tools``."""
    total = PRIMING_TOKENS
    if instructions:
        total += PER_MESSAGE_TOKENS + text_tokens(instructions)
    if isinstance(value, str):
        total += PER_MESSAGE_TOKENS + text_tokens(value)
    elif isinstance(value, list):
        for item in value:
            total += PER_MESSAGE_TOKENS
            if isinstance(item, dict) and "content" in item:
                total += _content_tokens(item["content"])
            else:
                total += _json_tokens(item)
    if tools:
        total += _json_tokens(tools)
    return total
