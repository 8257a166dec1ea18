"""Cost of applying one spec record to the catalogue, at 1k, 5k and 20k documents: checked for what it changes
(``Catalogue.apply``) against the whole set re-validated for each record (how the catalogue worked before).

    .venv/bin/python benchmarks/catalogue.py                      # 1,000, 5,000 and 20,000 documents
    .venv/bin/python benchmarks/catalogue.py --sizes 20000 --whole-records 5

A set of N documents is N // 100 pools and the rest entitlements (elastic and spot, one API key digest each),
spread over the pools. The records, in turn: an entitlement's SLO changed (the common record), a new entitlement and
its deletion, a pool's spec changed, and two the set refuses (an entitlement naming no pool, one whose API key
another entitlement holds). The baseline is the whole-set validation, measured in the same run on the same records
(fewer of them: it costs about a second per record at 20,000 documents); each figure is the median of the runs.
The target is <= 1 ms per record at 20,000 documents.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from tokenpools.config import ConfigError, load_config_documents
from tokenpools.runtime.specs import Catalogue
from tokenpools.topics.records import SpecRecord

TARGET_MS = 1.0
API_VERSION = "tokenpools.io/v1alpha1"


def digest(i: int) -> str:
    return hashlib.sha256(f"key-{i}".encode()).hexdigest()


def pool_spec(slo_variant: int = 0) -> dict[str, Any]:
    return {"model": "m", "backendRef": {"name": "b"}, "scaling": {"minReplicas": 1, "maxReplicas": 4 + slo_variant},
            "perReplica": {"tokensPerSecond": 480, "kvCacheGiB": 8, "concurrency": 16}, "kvBytesPerToken": 147456}


def entitlement_spec(i: int, pool: str, slo_ms: int = 500) -> dict[str, Any]:
    spec: dict[str, Any] = {"tenantId": f"tenant-{i}", "poolRef": {"name": pool},
                            "qos": {"serviceClass": "elastic" if i % 2 else "spot", "sloTargetMs": slo_ms},
                            "apiKeys": [{"sha256": digest(i)}]}
    if i % 2:
        spec["resources"] = {"tokensPerSecond": 10, "kvCacheGiB": 0.1, "concurrency": 1}
    return spec


def documents(n: int) -> list[dict[str, Any]]:
    pools = max(1, n // 100)
    docs = [{"apiVersion": API_VERSION, "kind": "TokenPool", "metadata": {"name": f"pool-{p}"}, "spec": pool_spec()}
            for p in range(pools)]
    docs += [{"apiVersion": API_VERSION, "kind": "TokenEntitlement", "metadata": {"name": f"ent-{i}"},
              "spec": entitlement_spec(i, f"pool-{i % pools}")} for i in range(n - pools)]
    return docs


def records(n: int) -> list[SpecRecord]:
    """One round of the record mix (applying it leaves the set as it was, but for the SLO and the pool's scaling)."""
    pools = max(1, n // 100)
    mid = (n - pools) // 2

    def ent(i: int, pool: str, **changes: Any) -> SpecRecord:
        return SpecRecord(kind="TokenEntitlement", name=f"ent-{i}", pool=pool, spec={**entitlement_spec(i, pool),
                                                                                      **changes}, t_ms=0)

    new = n + 1
    return [
        ent(mid, f"pool-{mid % pools}", qos={"serviceClass": "elastic" if mid % 2 else "spot", "sloTargetMs": 750}),
        ent(new, "pool-0"),
        ent(new, "pool-0").model_copy(update={"deleted": True, "spec": {}}),
        SpecRecord(kind="TokenPool", name="pool-0", pool="pool-0", spec=pool_spec(1), t_ms=0),
        ent(new, "no-such-pool"),  # refused
        ent(new, "pool-0", apiKeys=[{"sha256": digest(mid)}]),  # refused: ent-{mid} holds the key
    ]


class WholeSet:
    """The catalogue as it was: each record re-validates every document (the baseline)."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = {(d["kind"], d["metadata"]["name"]): d for d in docs}

    def apply(self, record: SpecRecord) -> str | None:
        docs = dict(self.docs)
        key = (record.kind, record.name)
        if record.deleted:
            docs.pop(key, None)
        else:
            docs[key] = {"apiVersion": API_VERSION, "kind": record.kind, "metadata": {"name": record.name},
                         "spec": dict(record.spec)}
        try:
            load_config_documents(list(docs.values()), source=f"spec {record.kind}/{record.name}")
        except ConfigError as exc:
            return "; ".join(str(p) for p in exc.problems)[:2000]
        self.docs = docs
        return None


def ms_per_record(apply: Callable[[SpecRecord], str | None], mix: list[SpecRecord], count: int) -> float:
    t0 = time.perf_counter()
    for i in range(count):
        apply(mix[i % len(mix)])
    return (time.perf_counter() - t0) * 1000 / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,20000", help="documents per set, comma-separated")
    parser.add_argument("--records", type=int, default=3000, help="records per run, incremental (default 3,000)")
    parser.add_argument("--whole-records", type=int, default=6,
                        help="records per run, whole-set baseline (default 6: one round of the mix)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure; the median is printed (default 3)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"python {platform.python_version()} on {platform.machine()}; median of {args.runs} runs; records per run: "
          f"{args.records:,} incremental, {args.whole_records} whole-set")
    print(f"{'documents':>10} {'whole set, ms/record':>22} {'incremental, ms/record':>24} {'ratio':>9}")
    worst_at_largest = 0.0
    for n in sizes:
        docs, mix = documents(n), records(n)
        whole = WholeSet(docs)
        catalogue = Catalogue.from_loaded(load_config_documents(docs, source="benchmark"))
        decisions = [catalogue.apply(r) is None for r in mix]
        assert decisions == [whole.apply(r) is None for r in mix] == [True, True, True, True, False, False]
        old = statistics.median(ms_per_record(whole.apply, mix, args.whole_records) for _ in range(args.runs))
        new = statistics.median(ms_per_record(catalogue.apply, mix, args.records) for _ in range(args.runs))
        print(f"{n:>10,} {old:>22.3f} {new:>24.4f} {old / new:>8,.0f}x")
        if n == max(sizes):
            worst_at_largest = new
    verdict = "within" if worst_at_largest <= TARGET_MS else "OVER"
    print(f"incremental at {max(sizes):,} documents: {worst_at_largest:.4f} ms per record, {verdict} the "
          f"{TARGET_MS:g} ms target")
    return 0 if worst_at_largest <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
