"""The dev Prometheus's config (tokenpools_dev.devstack.prometheus.render_config): a job may have its own scrape
interval and timeout, as real vLLM's targets need (docs/vllm.md); the others keep timeout == interval."""

from __future__ import annotations

import pytest

from tokenpools_dev.devstack.prometheus import ScrapeJob, render_config, vllm_job


def test_a_job_with_a_timing_of_its_own_gets_it_and_the_others_the_global_interval() -> None:
    doc = render_config({"vllm-pool": vllm_job(["127.0.0.1:8000"]), "proxy": ["127.0.0.1:8080"]}, 1.0)
    jobs = {j["job_name"]: (j["scrape_interval"], j["scrape_timeout"]) for j in doc["scrape_configs"]}
    assert jobs == {"vllm-pool": ("5000ms", "5000ms"), "proxy": ("1000ms", "1000ms")}
    assert doc["global"]["scrape_interval"] == "1000ms"


@pytest.mark.parametrize(("interval_s", "timeout_s"), [(1.0, 2.0), (1.0, 0.0)])
def test_a_timeout_above_the_interval_or_none_is_refused(interval_s: float, timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        ScrapeJob(("127.0.0.1:8000",), interval_s=interval_s, timeout_s=timeout_s)
