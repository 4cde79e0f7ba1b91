"""TaugridNodes (schemas/kusto/050-functions.kql), the KQL twin of `tracker nodes`: the same pod outcomes
(tracker/read/pods.py), the same ordering, Cluster in every key, a lookback defaulting to 7 days, a README example and
an adx-mon resource. (The Kusto language-service check of its text is tests/deploy/test_kusto.py's.)"""

from __future__ import annotations

import re

import yaml

from tests.kql import render_adxmon
from tracker.core.vocab import LOST_POD_FAILURE
from tracker.read.pods import EVICTION_LOSSES
from tracker.shell.kusto_apply import SCHEMA_DIR, schema_commands


def body() -> str:
    return next(c.text for c in schema_commands() if ") TaugridNodes(" in c.text)


def test_taugrid_nodes_classifies_pods_as_tracker_nodes() -> None:
    text = body()
    assert re.search(r"\) TaugridNodes\(lookback:timespan = 7d, nodeLookback:timespan = 365d\) \{", text)
    evicted = re.search(r'Lost in \(([^)]*)\), "evicted"', text)
    assert evicted and tuple(v.strip().strip('"') for v in evicted.group(1).split(",")) == EVICTION_LOSSES
    assert f'isnotempty(FailureReason) or Lost == "{LOST_POD_FAILURE}", "failed"' in text
    assert 'RunStatus == "failed" and Attempt == LastAttempt' in text  # a run failed there: its last attempt's pod
    assert "coalesce(EndTime, ReleasedAt, now()) >= sinceTime" in text  # on its node in the window


def test_taugrid_nodes_keys_on_cluster_and_orders_worst_first() -> None:
    text = body()
    for key in ("by Cluster, RunId, Attempt, Pod", "by Cluster, RunId, Attempt", "by Cluster, RunId",
                "by Cluster, Node"):
        assert key in text, key
    for join in re.findall(r"lookup kind=leftouter [^\n]* on ([\w, ]+)", text):
        assert join.startswith("Cluster, "), join
    order = re.search(r"\| order by ([^\n]*)", text)
    assert order and order.group(1) == ("FailedPods desc, EvictedPods desc, RunsFailed desc, RunsEvicted desc, "
                                        "LastFailureAt desc, Cluster asc, Node asc")


def test_taugrid_nodes_is_documented_and_deployed() -> None:
    readme = (SCHEMA_DIR / "README.md").read_text()
    assert "**`TaugridNodes(lookback:timespan = 7d, nodeLookback:timespan = 365d)`**" in readme
    assert "\nTaugridNodes()\n" in readme
    functions = render_adxmon.DEPLOY_DIR / "functions.yaml"
    docs = [d for d in yaml.safe_load_all(functions.read_text()) if d]
    assert docs[-1]["metadata"]["name"] == "taugrid-nodes"  # the last resource: a block of its own at the end
    assert ") TaugridNodes(" in docs[-1]["spec"]["body"]
