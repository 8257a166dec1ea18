"""The priority the proxy writes into a request for the engine (vLLM's ``priority`` field, lower served first).

vLLM started with ``--scheduling-policy priority`` orders its waiting queue (and, when it must preempt, its
running batch) by the request's ``priority``, an integer where the smaller number goes first. The proxy's own
order is the service class, then w_e (docs/semantics.md#engine-priority); the engine's should agree, so that the
requests the proxy admitted into a contended pool are also served in that order once they are inside vLLM.

The mapping (pure, documented in docs/semantics.md#engine-priority):

    engine priority = CLASS_BAND[class] × BAND_WIDTH + sub_rank(w_e / w_κ)
    sub_rank(ρ)     = clamp(⌊SUB_MID − SUB_PER_DECADE · log10 ρ + ½⌋, 0, BAND_WIDTH − 1)   (ρ ≤ 0: the band's last)

- the class is a band of ``BAND_WIDTH`` (100) numbers: dedicated 0–99, guaranteed 100–199, elastic 200–299, spot
  300–399, preemptible 400–499. A request of a higher class therefore never carries a larger number than one of a
  lower class, whatever their w_e: the class is the promise, w_e only orders within it;
- within a band, ρ = w_e / w_κ (w_e divided by its class weight) is the product of Eq. 1's SLO, burst and debt
  factors: the same scale for every class, whatever the configured class weights. It spans ~3 decades in
  practice (debt can raise it to 5, a heavy burst and a tight floor take it to ~0.01), so a log scale with 25
  steps a decade centred on ρ = 1 (sub-rank 50) keeps ρ from 0.01 (99) to 10 (25) apart in whole numbers. A
  larger w_e never gets a larger number (monotone: ``tests/unit/test_engine_priority.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tokenpools.core.classes import ServiceClass

BAND_WIDTH = 100
SUB_MID = 50.0
SUB_PER_DECADE = 25.0
CLASS_BAND: dict[ServiceClass, int] = {
    ServiceClass.DEDICATED: 0,
    ServiceClass.GUARANTEED: 1,
    ServiceClass.ELASTIC: 2,
    ServiceClass.SPOT: 3,
    ServiceClass.PREEMPTIBLE: 4,
}
LOWEST = (max(CLASS_BAND.values()) + 1) * BAND_WIDTH - 1  # the largest number the mapping gives (499)


def sub_rank(ratio: float) -> int:
    """The place within a class's band for ρ = w_e / w_κ: 0 (first) … ``BAND_WIDTH - 1`` (last)."""
    if not ratio > 0 or math.isnan(ratio):
        return BAND_WIDTH - 1
    if math.isinf(ratio):
        return 0
    rank = math.floor(SUB_MID - SUB_PER_DECADE * math.log10(ratio) + 0.5)
    return min(BAND_WIDTH - 1, max(0, rank))


def engine_priority(service_class: ServiceClass, w_e: float, class_weights: Mapping[ServiceClass, float]) -> int:
    """vLLM's ``priority`` for a request of ``service_class`` admitted with priority ``w_e`` (Eq. 1), given the
    policy's class weights w_κ (``PolicyConstants.class_weights``). Lower is served first.

    >>> from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS
    >>> guaranteed = engine_priority(ServiceClass.GUARANTEED, 1000.0, DEFAULT_CLASS_WEIGHTS)
    >>> elastic = engine_priority(ServiceClass.ELASTIC, 31.25, DEFAULT_CLASS_WEIGHTS)
    >>> guaranteed, elastic
    (150, 263)
    """
    return CLASS_BAND[service_class] * BAND_WIDTH + sub_rank(w_e / class_weights[service_class])
