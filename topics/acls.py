"""Who may do what on the deployment's topics: the least-privilege Kafka ACLs of each component, as data.

The topic contract says which component writes and which reads each topic; this module turns that into the ACL
rules a secured cluster needs, one principal per component (``Role``), so nothing outside its role is possible:

| role | may write | may read | other |
|---|---|---|---|
| proxy | requests, completions, heartbeats, dead-letters | limits, counts, specs, budgets | no consumer group |
| agents | limits, scale, effective-limits, counts, dead-letters, usage-windows, budgets, usage, budget-alerts | requests, completions, backend-metrics, specs, heartbeats, usage-windows, limits, budgets | its group and its own topics (``<app_id>-`` prefix: the table's changelog, Faust's internal topics), which it may create |
| controller | specs, backend-metrics | scale | no consumer group |
| recorder | nothing | every topic of the prefix | its group |

A proxy principal can therefore not write a limit update: the broker refuses it (the test on the real broker,
tests/integration/test_kafka_security.py). Topics themselves are created by an administrator
(deploy/base/kafka/create-topics.sh); the agents only create their own. ``rules`` is what
deploy/secured/create-acls.sh and deploy/operators/kafka-users.yaml (Strimzi's KafkaUsers) are rendered from and
what the tests apply, so the script, the users, the docs and the tests cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tokenpools.topics.declarations import Topics


class Role(StrEnum):
    PROXY = "proxy"
    AGENTS = "agents"
    CONTROLLER = "controller"
    RECORDER = "recorder"


class Resource(StrEnum):
    TOPIC = "topic"
    GROUP = "group"


class Pattern(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DESCRIBE = "describe"
    DESCRIBE_CONFIGS = "describe-configs"


@dataclass(frozen=True, slots=True)
class AclRule:
    """Allow ``principal`` ``operation`` on ``resource`` ``name`` (a name, or a prefix with ``Pattern.PREFIXED``)."""

    role: Role
    principal: str  # "User:<name>"
    resource: Resource
    pattern: Pattern
    name: str
    operation: Operation


@dataclass(frozen=True, slots=True)
class Principals:
    """The user each role authenticates as (SCRAM user name, or the CN of its client certificate), and the names
    its groups and own topics carry."""

    proxy: str = "tokenpools-proxy"
    agents: str = "tokenpools-agents"
    controller: str = "tokenpools-controller"
    recorder: str = "tokenpools-recorder"
    agents_app_id: str = "tokenpools-agents"  # streams.app_id: the agents' group and their topics' prefix
    recorder_group: str = "tokenpools-recorder"  # tokenpools record --group-id

    def user(self, role: Role) -> str:
        return str(getattr(self, role.value))


def rules(topics: Topics, prefix: str, principals: Principals = Principals()) -> list[AclRule]:
    """Every allow rule of every role, in a fixed order. ``prefix`` is ``kafka.topic_prefix`` (``topics`` must be
    declared with it: the recorder reads everything under it)."""
    if not all(t.name.startswith(prefix) for t in topics.all()):
        raise ValueError(f"topics are not all named with the prefix {prefix!r}")
    t = topics
    writes = {
        Role.PROXY: (t.requests, t.completions, t.heartbeats, t.dead_letters),
        Role.AGENTS: (t.limits, t.scale, t.effective_limits, t.counts, t.dead_letters, t.usage_windows, t.budgets,
                      t.usage, t.budget_alerts),
        Role.CONTROLLER: (t.specs, t.backend_metrics),
        Role.RECORDER: (),
    }
    reads = {
        Role.PROXY: (t.limits, t.counts, t.specs, t.budgets),
        Role.AGENTS: (t.requests, t.completions, t.backend_metrics, t.specs, t.heartbeats, t.usage_windows,
                      t.limits, t.budgets),  # (the last two read back: the shares granted, the tenant parts)
        Role.CONTROLLER: (t.scale,),
        Role.RECORDER: (),
    }
    out: list[AclRule] = []
    for role in Role:
        who = f"User:{principals.user(role)}"

        def allow(resource: Resource, pattern: Pattern, name: str, *operations: Operation, role: Role = role,
                  who: str = who) -> None:
            out.extend(rule for op in operations  # (a topic read and written: its Describe once)
                       if (rule := AclRule(role, who, resource, pattern, name, op)) not in out)

        for topic in writes[role]:
            allow(Resource.TOPIC, Pattern.LITERAL, topic.name, Operation.WRITE, Operation.DESCRIBE)
        for topic in reads[role]:
            allow(Resource.TOPIC, Pattern.LITERAL, topic.name, Operation.READ, Operation.DESCRIBE)
        if role is Role.AGENTS:
            allow(Resource.TOPIC, Pattern.PREFIXED, f"{principals.agents_app_id}-", Operation.CREATE,
                  Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS)
            allow(Resource.GROUP, Pattern.LITERAL, principals.agents_app_id, Operation.READ, Operation.DESCRIBE)
        if role is Role.RECORDER:
            allow(Resource.TOPIC, Pattern.PREFIXED, prefix, Operation.READ, Operation.DESCRIBE)
            allow(Resource.GROUP, Pattern.LITERAL, principals.recorder_group, Operation.READ, Operation.DESCRIBE)
    return out
