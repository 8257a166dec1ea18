"""Series of a Prometheus text exposition (a ``/metrics`` page), read by hand (pure: text in).

Only what calibrate needs: one metric's series, as label dicts and values. Comments, other metrics and lines that do
not parse are skipped. (``prometheus_client``'s parser would rename counter samples; vLLM's names are kept as served.)
"""

from __future__ import annotations

import re

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name``: (its labels, its value)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        rest = line[len(name):]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            end = rest.rfind("}")
            if end < 0:
                continue
            labels = dict(_LABEL.findall(rest[1:end]))
            rest = rest[end + 1:]
        try:
            out.append((labels, float(rest.split()[0])))
        except (IndexError, ValueError):
            continue
    return out


def model_total(text: str, name: str, model: str) -> float | None:
    """The sum of ``name`` over the series of ``model`` (``model_name`` label; all series if none has one); None
    when there is no such series."""
    found = series(text, name)
    mine = [v for labels, v in found if labels.get("model_name", model) == model]
    return sum(mine) if mine else None


def counter_increase(before: str | None, after: str | None, name: str, model: str,
                     witness: str | None = None) -> float | None:
    """How much ``model``'s counter ``name`` grew from the page ``before`` to the page ``after``.

    A labelled counter appears at its first increment (llm-d-inference-sim's queue time does), so a series missing
    from a page counts as 0 when the page has the model's ``witness`` series (one the backend always exposes: then
    it is that backend, and the counter has not moved yet). None when a page is missing (no ``/metrics``), or the
    counter is missing from ``after`` without a witness (the backend does not have it)."""
    if before is None or after is None:
        return None

    def value(page: str) -> float | None:
        total = model_total(page, name, model)
        if total is None and witness is not None and model_total(page, witness, model) is not None:
            return 0.0
        return total

    end = value(after)
    return None if end is None else end - (value(before) or 0.0)
