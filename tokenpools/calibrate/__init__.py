"""``tokenpools calibrate``: measure what one backend replica serves, and write the pool's ``perReplica`` block.

An operator runs it against one replica (vLLM, or anything OpenAI-compatible) before writing a TokenPool. It sends
streaming requests at concurrency 1, 2, 4, … up to a maximum, measures throughput and latency at each step, and
keeps the largest concurrency whose P99 TTFT stays under a target: its tokens/s and concurrency, with the KV cache
vLLM reports, are the replica's capacity (docs/calibrate.md).

Pure modules (no HTTP, no event loop, no clock; an import-linter contract holds them to it):

- ``plan``: the run's validated settings and its steps;
- ``workload``: the requests: distinct prompts of about the asked length, their bodies;
- ``stats``: one request's result (``RequestOutcome``) and a step's statistics (with the time its requests waited
  in vLLM's own queue, where ``/metrics`` says);
- ``choose``: each step's verdict against the target (``StepVerdict``) and the chosen step;
- ``exposition``: series read from a ``/metrics`` page;
- ``kv``: the KV cache a backend holds, from vLLM's ``vllm:cache_config_info``;
- ``block``: the ``perReplica`` block and the YAML snippet;
- ``result``: the whole calibration and its JSON document.

Shells: ``probe`` (the requests, with aiohttp; the clock), ``view`` (the rich table), ``plot`` (matplotlib) and
``cli`` (the command's arguments and files).
"""
