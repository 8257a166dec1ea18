"""API keys held in Kubernetes Secrets (``apiKeys[].secretRef``) → the digests the specs topic carries.

Pure: a function of the verdicts and the Secrets' data as read. An entitlement's ``secretRef`` names a key of a
Secret in the entitlement's namespace; its value is the API key in clear. What is published is its SHA-256
(``tokenpools.config.hash_api_key``), in the place of the reference, exactly as if the spec had said ``sha256``:
the key itself never leaves the controller, so neither the specs topic nor anyone who reads it learns it.

- A reference that cannot be resolved (no such Secret, no such key, an empty value, a Secret the controller may
  not read) is left out, and the entitlement's verdict message says which and why; its other keys still work.
- Rotation is two references during the overlap: list the new key beside the old one, let clients move, remove
  the old one. A changed value in a Secret is picked up at the next evaluation (``controllers.resync_s``): both the
  old and the new digests are never valid at once for one reference, so keep two references for a smooth rotation.
- A digest that two entitlements may not share (one Secret key's value equal to another entitlement's key) is left
  out of all of them, with a message: a key names one tenant, and at most one entitlement per pool (the config
  validator's rule, docs/tenancy.md). One tenant's entitlements on different pools may share a key: the request's
  model picks among them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tokenpools.config import hash_api_key
from tokenpools.controllers.reconcile import ENTITLEMENT, Evaluation, Verdict

SecretId = tuple[str, str]  # (namespace, name)
SecretData = Mapping[str, str]  # key → value in clear (decoded)


def _refs(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(k["secretRef"]["name"], k["secretRef"]["key"]) for k in spec.get("apiKeys", []) if "secretRef" in k]


def _namespace(evaluation: Evaluation, name: str, default_namespace: str) -> str:
    loaded = evaluation.loaded
    doc = loaded.entitlement_documents.get(name) if loaded is not None else None
    return (doc.metadata.namespace if doc is not None else None) or default_namespace


def _may_share(evaluation: Evaluation, names: set[str]) -> bool:
    """One tenant's entitlements, each on a pool of its own (the validator's rule for a key listed twice)."""
    verdicts = [evaluation.verdicts[(ENTITLEMENT, name)] for name in names]
    pools = [v.pool for v in verdicts]
    tenants = {(v.spec or {}).get("tenantId") for v in verdicts}
    return len(set(pools)) == len(pools) and len(tenants) == 1


def referenced(evaluation: Evaluation, default_namespace: str) -> set[SecretId]:
    """The Secrets the entitlements to be published refer to."""
    return {(_namespace(evaluation, key[1], default_namespace), secret)
            for key, v in evaluation.verdicts.items() if key[0] == ENTITLEMENT and v.spec is not None
            for secret, _ in _refs(v.spec)}


def resolve(evaluation: Evaluation, secrets: Mapping[SecretId, SecretData | str], default_namespace: str
            ) -> Evaluation:
    """``evaluation`` with every ``secretRef`` replaced by the digest of its value (``secrets``: what each Secret held,
    or why it could not be read)."""
    resolved: dict[str, list[dict[str, str]]] = {}
    notes: dict[str, list[str]] = defaultdict(list)
    for key, verdict in evaluation.verdicts.items():
        if key[0] != ENTITLEMENT or verdict.spec is None:
            continue
        namespace = _namespace(evaluation, key[1], default_namespace)
        keys: list[dict[str, str]] = []
        for entry in verdict.spec.get("apiKeys", []):
            if "secretRef" not in entry:
                keys.append(dict(entry))
                continue
            name, item = entry["secretRef"]["name"], entry["secretRef"]["key"]
            data = secrets.get((namespace, name), "not read")
            if isinstance(data, str):
                notes[key[1]].append(f"Secret {namespace}/{name}: {data}")
            elif not data.get(item):
                notes[key[1]].append(f"Secret {namespace}/{name} has no {'value for' if item in data else 'key'} "
                                     f"{item!r}")
            else:
                keys.append({"sha256": hash_api_key(data[item])})
        resolved[key[1]] = keys
    holders: dict[str, set[str]] = defaultdict(set)
    for name, keys in resolved.items():
        for k in keys:
            holders[k["sha256"]].add(name)
    shared = {digest for digest, names in holders.items() if len(names) > 1 and not _may_share(evaluation, names)}
    for digest in sorted(shared):
        for name in sorted(holders[digest]):
            others = ", ".join(sorted(holders[digest] - {name}))
            notes[name].append(f"an API key is also {others}'s: left out of both")
    verdicts: dict[Any, Verdict] = dict(evaluation.verdicts)
    for name, keys in resolved.items():
        verdict = verdicts[(ENTITLEMENT, name)]
        assert verdict.spec is not None
        kept = [k for k in keys if k["sha256"] not in shared]
        if kept == verdict.spec.get("apiKeys", []) and not notes.get(name):
            continue
        message = verdict.message + "".join(f"; apiKeys: {n}" for n in notes.get(name, []))
        verdicts[(ENTITLEMENT, name)] = replace(verdict, spec={**verdict.spec, "apiKeys": kept}, message=message)
    return replace(evaluation, verdicts=verdicts)
