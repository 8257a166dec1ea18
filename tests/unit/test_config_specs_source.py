"""Whether a config file must hold a pool depends on where specs come from (``SpecsSource``, issue 31): a process
that follows the specs topic starts from settings only and serves what the topic brings; where only the file is
read (validate, replay, a proxy with Kafka off), a file without a pool could never serve anything and is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tokenpools_dev.builders import entitlement_doc

from tokenpools.config import ConfigError, SpecsSource, load_config, load_config_text, require_pools
from tokenpools.config.loader import NO_POOL_SETTINGS_ONLY, NO_POOL_WITHOUT_TOPIC, missing_pools

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = """apiVersion: tokenpools.io/v1alpha1
kind: TokenPoolsSettings
metadata: {name: settings}
spec:
  proxy: {port: 8081}
"""


def test_settings_only_is_a_config_where_the_specs_topic_brings_the_pools() -> None:
    loaded = load_config_text(SETTINGS, "settings.yaml", SpecsSource.TOPIC)
    assert loaded.pools == {} and loaded.entitlements == {} and loaded.entitlement_by_key_hash == {}
    assert loaded.settings_values == {"proxy": {"port": 8081}}
    assert missing_pools(loaded, SpecsSource.TOPIC) is None
    require_pools(loaded, SpecsSource.TOPIC)  # nothing to refuse


def test_settings_only_is_refused_where_only_the_file_is_read_and_says_why() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config_text(SETTINGS, "settings.yaml")  # the default: the file alone
    assert [str(p) for p in raised.value.problems] == [f"settings.yaml: {NO_POOL_SETTINGS_ONLY}"]
    loaded = load_config_text(SETTINGS, "settings.yaml", SpecsSource.TOPIC)
    assert missing_pools(loaded, SpecsSource.FILE) == NO_POOL_WITHOUT_TOPIC
    with pytest.raises(ConfigError) as raised:
        require_pools(loaded, SpecsSource.FILE)
    (line,) = str(raised.value).splitlines()
    assert line.startswith("settings.yaml: no TokenPool document") and "Kafka" in line


@pytest.mark.parametrize("specs", list(SpecsSource))
def test_a_file_with_pools_is_the_same_config_from_either_source(specs: SpecsSource) -> None:
    exp1 = ROOT / "examples" / "exp1.yaml"
    loaded = load_config(exp1, specs)
    assert loaded == load_config(exp1)
    assert missing_pools(loaded, specs) is None


@pytest.mark.parametrize("specs", list(SpecsSource))
def test_an_entitlement_still_needs_its_pool_in_the_same_file(specs: SpecsSource) -> None:
    """Settings only is allowed, not a half set: what the file holds is validated as a whole either way."""
    entitlement = yaml.safe_dump(entitlement_doc("e", "p", service_class="spot"))
    with pytest.raises(ConfigError, match="poolRef|no TokenPool"):
        load_config_text(SETTINGS + "---\n" + entitlement, "x.yaml", specs)
