"""Thin Kubernetes adapter: each method is one API call named for the act, off the event loop."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from multislice_operator.api import models

log = logging.getLogger("multislice_operator.kube")

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
COMPONENT = "multislice-operator"


def load_api_client(pool_size: int = 32) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def create_jobset(self, body: dict[str, Any]) -> bool:
        """Create the JobSet; False when one of that name exists already (idempotent)."""
        ns = body["metadata"]["namespace"]
        try:
            await self._run(
                self.custom.create_namespaced_custom_object,
                JOBSET_GROUP,
                JOBSET_VERSION,
                ns,
                JOBSET_PLURAL,
                body,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._run(
                self.custom.get_namespaced_custom_object,
                JOBSET_GROUP,
                JOBSET_VERSION,
                namespace,
                JOBSET_PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def set_jobset_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        await self._run(
            self.custom.patch_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            namespace,
            JOBSET_PLURAL,
            name,
            {"spec": {"suspend": suspend}},
        )

    async def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status; return the job as the apiserver has it after the patch."""
        updated: dict[str, Any] = await self._run(
            self.custom.patch_namespaced_custom_object_status,
            models.GROUP,
            models.VERSION,
            namespace,
            models.PLURAL,
            name,
            {"status": status},
        )
        return updated

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self._run(
                self.custom.delete_namespaced_custom_object,
                models.GROUP,
                models.VERSION,
                namespace,
                models.PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_jobs(self) -> list[dict[str, Any]]:
        result = await self._run(
            self.custom.list_cluster_custom_object, models.GROUP, models.VERSION, models.PLURAL
        )
        items: list[dict[str, Any]] = result.get("items", [])
        return items

    async def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the MultisliceJob (what `kubectl describe msj` shows)."""
        meta = job.get("metadata") or {}
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{meta.get('name', 'msj')}.", namespace=meta.get("namespace")
            ),
            involved_object=client.V1ObjectReference(
                api_version=models.API_VERSION,
                kind=models.KIND,
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=COMPONENT,
        )
        try:
            await self._run(self.core.create_namespaced_event, meta.get("namespace"), event)
        except ApiException as exc:  # events are best effort; never fail a reconcile on them
            log.warning("event not posted reason=%s status=%s", reason, exc.status)


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
