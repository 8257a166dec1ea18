"""The KV cache one replica holds, from vLLM's ``vllm:cache_config_info`` on ``/metrics`` (pure: text in).

vLLM exposes its ``CacheConfig`` as the labels of one gauge per engine. vLLM 0.32 (measured, CPU build):
``num_gpu_blocks="16384"``, ``block_size="128"``, ``kv_cache_size_tokens="2097152"`` and
``kv_cache_memory_bytes="1073741824"`` (the memory it set aside for the cache: on CPU ``VLLM_CPU_KVCACHE_SPACE``,
on a GPU ``--kv-cache-memory-bytes`` if given, else the label reads ``None``). llm-d-inference-sim exposes only
``block_size`` and ``num_gpu_blocks``. A replica running several engines (data parallel) has one series each; their
caches add up.

A pool counts KV cache in GiB and converts it into tokens with its own bytes per token c (``kvBytesPerToken``, or
``kvGeometry``): context tokens = kvCacheGiB · 2^30 / c. So ``kvCacheGiB`` is, in this order of preference:

1. the blocks × block size tokens × c / 2^30, when c is given (``--kv-bytes-per-token``): the pool then counts
   exactly the tokens vLLM holds;
2. ``kv_cache_memory_bytes`` / 2^30, when vLLM reports it: what vLLM reserved. The tokens it holds are reported
   too, and the bytes per token they imply, for the operator to compare with the pool's c;
3. not derivable (no series, or tokens without bytes and no c): omitted, with a note saying what is known.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.calibrate.exposition import series as samples

GIB = 2**30
METRIC = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class KvCache:
    """What the backend reports of its cache, summed over its engines; None where it says nothing."""

    engines: int
    tokens: int | None  # blocks × block size (or vLLM's kv_cache_size_tokens)
    memory_bytes: int | None
    blocks: int | None = None
    block_size_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KvEstimate:
    """``kvCacheGiB`` (None: not derivable) and how it was derived, or why it was not: one sentence."""

    gib: float | None
    how: str


def _whole(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


def _sum(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def parse_cache_config(metrics_text: str) -> KvCache | None:
    """The cache described by the ``vllm:cache_config_info`` series of a ``/metrics`` page; None without one."""
    series = [labels for labels, _ in samples(metrics_text, METRIC)]
    if not series:
        return None
    blocks = [_whole(s, "num_gpu_blocks") for s in series]
    sizes = [_whole(s, "block_size") for s in series]
    tokens = [b * z if b is not None and z is not None else _whole(s, "kv_cache_size_tokens")
              for s, b, z in zip(series, blocks, sizes)]
    one_size = sizes[0] if len(set(sizes)) == 1 else None
    return KvCache(engines=len(series), tokens=_sum(tokens),
                   memory_bytes=_sum([_whole(s, "kv_cache_memory_bytes") for s in series]),
                   blocks=_sum(blocks), block_size_tokens=one_size)


def kv_cache_gib(kv: KvCache | None, kv_bytes_per_token: int | None) -> KvEstimate:
    """``kvCacheGiB`` from what the backend reported and the pool's bytes per token, if given (see the module)."""
    if kv is None:
        return KvEstimate(None, f"not derivable: the backend's /metrics has no {METRIC} (vLLM exposes it); "
                                "give the replica's KV cache in GiB yourself")
    if kv.tokens is not None and kv_bytes_per_token is not None:
        return KvEstimate(kv.tokens * kv_bytes_per_token / GIB,
                          f"{kv.tokens:,} tokens of KV cache ({_blocks(kv)}) × {kv_bytes_per_token} bytes per token "
                          "(--kv-bytes-per-token)")
    if kv.memory_bytes is not None:
        implied = (f" = {kv.tokens:,} tokens ({_blocks(kv)}) at {kv.memory_bytes / kv.tokens:,.0f} bytes per token: "
                   "the pool's kvBytesPerToken (or kvGeometry) should say the same" if kv.tokens else "")
        return KvEstimate(kv.memory_bytes / GIB, f"vLLM's kv_cache_memory_bytes, {kv.memory_bytes:,} bytes{implied}")
    if kv.tokens is not None:
        return KvEstimate(None, f"not derivable: the backend holds {kv.tokens:,} tokens of KV cache ({_blocks(kv)}) "
                                "but does not say their bytes; give --kv-bytes-per-token (the pool's kvBytesPerToken, "
                                "or 2·layers·kvHeads·headDim·bytesPerElement) to convert them")
    return KvEstimate(None, f"not derivable: {METRIC} names neither the cache's blocks nor its bytes")


def _blocks(kv: KvCache) -> str:
    engines = f" over {kv.engines} engines" if kv.engines > 1 else ""
    if kv.blocks is not None and kv.block_size_tokens is not None:
        return f"{kv.blocks:,} blocks of {kv.block_size_tokens}{engines}"
    return f"vLLM's kv_cache_size_tokens{engines}"
