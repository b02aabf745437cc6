"""The node-pool listing asks GKE only for the fields the operator reads (issue 57: a 256-slice
gang's listings parsed 540 KB of protobuf JSON each, every resync), through Google APIs'
response field mask; the simulated cloud applies and checks masks as the real service does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud.container_v1 import ClusterManagerClient
from google.cloud.container_v1.types import cluster_service

from multislice_local import fieldmask
from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_operator.provisioning import gke
from multislice_operator.provisioning.gke import GkeProvisioner
from tests.integration.test_gke_provisioner import (
    CLUSTER,
    FAST_RETRY,
    PROJECT,
    UID,
    ZONE,
    plan_of,
)

PARENT = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"


@pytest.fixture
def sim() -> Iterator[GkeSimulator]:
    with GkeSimulator(SimConfig(op_latency_s=0.05), registrar=InMemoryRegistrar()) as s:
        yield s


@pytest.fixture
def prov(sim: GkeSimulator) -> Iterator[GkeProvisioner]:
    p = GkeProvisioner.from_endpoint(sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY)
    try:
        yield p
    finally:
        p.close()


def _observed(prov: GkeProvisioner) -> list[dict[str, Any]]:
    async def both() -> list[dict[str, Any]]:
        owned = sorted(await prov.list_owned(), key=lambda o: o.name)
        return [asdict(o) for o in owned]

    return asyncio.run(both())


def _settled(sim: GkeSimulator, prov: GkeProvisioner, want: int) -> None:
    async def wait() -> None:
        for _ in range(200):
            pools = sim.pools()
            if len(pools) == want and all(
                p.get("status") not in ("PROVISIONING", "STOPPING") for p in pools.values()
            ):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(sim.pools())

    asyncio.run(wait())


def test_the_masked_listing_observes_what_the_whole_listing_does(
    sim: GkeSimulator, prov: GkeProvisioner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every field the observation reads is in the mask: pools of every kind (running, spot,
    flex-start waiting with a run duration, one whose create failed with GKE's message, one of
    another zone) map to the same observations through the mask as through the whole pool."""
    plans = [
        plan_of("plain", slices=2),
        plan_of("spot", capacity={"type": "Spot"}),
        plan_of("flex", capacity={"type": "FlexStart", "maxRunDurationSeconds": 7200}),
        plan_of("out"),
    ]
    sim.set_faults(flex_start_hold=3)
    for plan in plans[:-1]:
        assert asyncio.run(prov.create(plan, plan.node_pools, UID)).errors == []
    sim.set_faults(stockout_next=1)
    asyncio.run(prov.create(plans[-1], plans[-1].node_pools, UID))
    _settled(sim, prov, sum(len(p.node_pools) for p in plans))
    masked = _observed(prov)
    monkeypatch.setattr(gke, "LISTED_POOL_FIELDS", "*")
    whole = _observed(prov)
    assert masked == whole
    kinds = {(o["status"], o["waits_for_capacity"], o["error"] is not None) for o in whole}
    assert len(kinds) >= 3, kinds  # the pools differ where the mask could lose something
    assert any(o["max_run_duration_s"] == 7200 for o in whole)
    assert all(o["owner_uid"] == UID and o["machine_type"] for o in whole)


def test_the_listing_sends_the_mask_and_gets_only_its_fields(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    plan = plan_of("plain", slices=2)
    assert asyncio.run(prov.create(plan, plan.node_pools, UID)).errors == []
    _settled(sim, prov, 2)
    listed = asyncio.run(prov._list_pools_now())
    assert sorted(p.name for p in listed) == sorted(p.name for p in plan.node_pools)
    whole = sim.handle("GET", f"/v1/{PARENT}/nodePools", b"")[1]["nodePools"]
    masked = sim.handle("GET", f"/v1/{PARENT}/nodePools", b"", gke.LISTED_POOL_FIELDS)[1]
    sent = [cluster_service.NodePool.to_dict(p, use_integers_for_enums=False) for p in listed]
    # What the provisioner holds is what the masked answer holds, and less than the pool:
    # no OAuth scopes, no management settings, no instance groups.
    assert [(p["config"]["oauth_scopes"], p["instance_group_urls"]) for p in sent] == [([], [])] * 2
    assert all(p["config"]["oauthScopes"] and p["management"] for p in whole)
    assert all(
        "oauthScopes" not in p["config"] and "management" not in p and p["config"]["labels"]
        for p in masked["nodePools"]
    )
    assert len(json.dumps(masked)) < len(json.dumps({"nodePools": whole})) / 2


def test_a_mask_naming_a_field_gke_does_not_have_is_refused(sim: GkeSimulator) -> None:
    """As the real service does: 400 INVALID_ARGUMENT naming the field, through the real
    client (the X-Goog-FieldMask header) and the `fields` query parameter alike."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    client = ClusterManagerClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options=ClientOptions(api_endpoint=sim.url),
    )
    with pytest.raises(gexc.BadRequest, match="nodePoolz"):
        client.list_node_pools(parent=PARENT, metadata=(("x-goog-fieldmask", "nodePoolz"),))
    with pytest.raises(gexc.BadRequest, match="has no sub-fields"):
        client.list_node_pools(
            parent=PARENT, metadata=(("x-goog-fieldmask", "nodePools(name(first))"),)
        )
    status, body = sim.handle("GET", f"/v1/{PARENT}/nodePools", b"", "nodePools(statuz)")
    assert status == 400 and "statuz" in body["error"]["message"]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("a", {"a": None}),
        ("a,b", {"a": None, "b": None}),
        ("a.b,a.c", {"a": {"b": None, "c": None}}),
        ("a/b", {"a": {"b": None}}),
        ("a(b,c(d)),e", {"a": {"b": None, "c": {"d": None}}, "e": None}),
        ("a(b),a", {"a": None}),  # the whole field wins
        ("a, b", {"a": None, "b": None}),
        ("*", None),
        ("", None),
    ],
)
def test_parse(text: str, want: Any) -> None:
    assert fieldmask.parse(text) == want


@pytest.mark.parametrize("text", ["a(b", "a)b", "a..b", "a,", "(a)"])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(fieldmask.FieldMaskError):
        fieldmask.parse(text)


def test_apply_keeps_the_named_fields_of_every_item() -> None:
    value = {"items": [{"a": 1, "b": {"c": 2, "d": 3}}, {"a": 4}], "next": "x"}
    mask = fieldmask.parse("items(a,b.c)")
    assert fieldmask.apply(value, mask) == {"items": [{"a": 1, "b": {"c": 2}}, {"a": 4}]}
    assert fieldmask.apply(value, None) == value


def test_resolve_takes_either_name_and_answers_with_json_names() -> None:
    descriptor = cluster_service.ListNodePoolsResponse.pb().DESCRIPTOR
    mask = fieldmask.resolve(fieldmask.parse("node_pools(status_message,config.resource_labels)"),
                             descriptor)  # fmt: skip
    assert mask == {"nodePools": {"statusMessage": None, "config": {"resourceLabels": None}}}
