"""Thin Kubernetes adapter: each method is one API call named for the act, all async.

It rides on kopf's own API client (the session, credentials and re-authentication kopf already
keeps for its watches), so the operator needs neither the `kubernetes` package (~30 MiB resident)
nor a thread per call. kopf's client is internal API: kopf is pinned exactly (pyproject.toml), and
every method here is exercised against a real apiserver by the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from datetime import UTC, datetime
from typing import Any

import kopf
import orjson
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors

from multislice_operator.api import models
from multislice_operator.common import keys

log = logging.getLogger("multislice_operator.kube")

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2"
MSJ = f"/apis/{models.GROUP}/{models.VERSION}"
LEASES = "/apis/coordination.k8s.io/v1"
NODE_LEASES = "kube-node-lease"  # the kubelets' heartbeat Leases, one per node
SLICES = f"/apis/{keys.SLICE_GROUP}/{keys.SLICE_VERSION}/{keys.SLICE_PLURAL}"
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"  # controller/versions.py refuses a Kueue without it
KUEUE = f"/apis/{KUEUE_API_VERSION}"
COMPONENT = "multislice-operator"
# kopf retries a failed call (5xx, 429, 403 during upgrades) after each of these delays; ours are
# short because the work queue backs the job off after that, without holding a worker.
BACKOFFS = (0.5, 1.0, 2.0)
# A 429's Retry-After: the apiserver's answer to overload (priority and fairness: 1-32 s, its
# maxRetryAfter; max-in-flight 1 s; a graceful shutdown 5 s: k8s.io/apiserver pkg/server/filters,
# pkg/util/flowcontrol/dropped_requests_tracker.go). kopf waits it (or its backoff, if longer)
# between the retries above; a call without retries (backoffs=()) waits it once and asks again,
# up to this long (longer is not the apiserver's: the caller's own schedule retries).
RETRY_AFTER_MAX = 32.0
# On every create and dry run of an object the operator renders: an apiserver whose schema lacks
# a field (a JobSet CRD older than v0.10.0 has no onJobFailureMessagePatterns) refuses the object
# with 400 "strict decoding error: unknown field ..." instead of dropping the field silently.
STRICT = "fieldValidation=Strict"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
# Server-side apply (JSON is YAML): the operator owns the fields it sends, by field manager.
APPLY_PATCH = {"Content-Type": "application/apply-patch+yaml"}
FIELD_MANAGER = "multislice-operator"
# Its own manager for the one entry of a Workload's status.admissionChecks it answers for (Kueue
# owns the others, and the list is a map keyed by name: kueue.x-k8s.io_workloads.yaml).
CHECK_FIELD_MANAGER = "multislice-operator-gang-check"

ApiError = kopf_errors.APIError
NotFound = kopf_errors.APINotFoundError
Conflict = kopf_errors.APIConflictError
Invalid = kopf_errors.APIUnprocessableEntityError
ClientError = kopf_errors.APIClientError
TooManyRequests = kopf_errors.APITooManyRequestsError


def retry_after(exc: ApiError) -> float | None:
    """The seconds a 429 asks the client to wait (its Retry-After header, else its Status's
    details.retryAfterSeconds, as kopf reads them); None when it says none."""
    if exc.status != 429:
        return None
    header = next((v for k, v in (exc.headers or {}).items() if k.lower() == "retry-after"), None)
    try:
        if header:
            return max(0.0, float(header))
        details = exc.details
        seconds = details.get("retryAfterSeconds") if details else None
        return max(0.0, float(seconds)) if seconds else None
    except (TypeError, ValueError):  # an HTTP date: the apiserver writes seconds only
        return None


def timestamp() -> str:
    """Now, as the apiserver writes times (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class Kube:
    """The operator's writes and the few reads that watches do not cover."""

    def __init__(self, settings: kopf.OperatorSettings) -> None:
        self.settings = settings

    async def _call(
        self,
        method: str,
        url: str,
        payload: object | None = None,
        headers: dict[str, str] | None = None,
        backoffs: tuple[float, ...] = BACKOFFS,
        wait_retry_after: bool = True,
    ) -> Any:
        """One call; kopf retries it after each of `backoffs` (a 429: after its Retry-After, if
        longer). Without retries, a 429 with Retry-After is still waited out once
        (`wait_retry_after`), then asked again."""
        once = wait_retry_after and not backoffs
        while True:
            try:
                response = await kopf_api.request(
                    method,
                    url,
                    payload=payload,
                    headers=headers,
                    backoffs=backoffs,
                    settings=self.settings,
                    logger=log,
                )
            except TooManyRequests as exc:
                wait = retry_after(exc)
                if not once or wait is None or wait > RETRY_AFTER_MAX:
                    raise
                once = False
                log.info("apiserver overloaded, retrying in %.0fs: %s %s", wait, method, url)
                await asyncio.sleep(wait)
                continue
            async with response:
                # orjson: a created JobSet's answer is the whole object (controller/apisession.py).
                return await response.json(loads=orjson.loads)

    # -- JobSets -------------------------------------------------------------------------------

    async def create_jobset(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the JobSet and return it; None when one of that name exists (idempotent)."""
        ns = body["metadata"]["namespace"]
        try:
            created: dict[str, Any] = await self._call(
                "post", f"{JOBSETS}/namespaces/{_q(ns)}/jobsets?{STRICT}", payload=body
            )
        except Conflict:
            return None
        return created

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._call(
                "get", f"{JOBSETS}/namespaces/{_q(namespace)}/jobsets/{_q(name)}"
            )
        except NotFound:
            return None
        return obj

    async def delete_jobset(
        self, namespace: str, name: str, uid: str = "", foreground: bool = False
    ) -> None:
        """Delete the JobSet now (its Jobs and pods go with it, background); gone is success.
        With `uid`: only that object (a precondition: a newer JobSet of the name is kept).
        `foreground`: the JobSet stays, deleting, until its Jobs and pods are gone."""
        options: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Foreground" if foreground else "Background",
        }
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            await self._call(
                "delete",
                f"{JOBSETS}/namespaces/{_q(namespace)}/jobsets/{_q(name)}",
                payload=options,
            )
        except (NotFound, Conflict):  # gone, or another object of that name now
            return

    # -- GKE Slices (dynamic slicing; cluster-scoped) -----------------------------------------

    async def create_slice(self, body: dict[str, Any]) -> None:
        """Create a `Slice`; one of that name already there is success (idempotent)."""
        try:
            await self._call("post", f"{SLICES}?{STRICT}", payload=body)
        except Conflict:
            return

    async def delete_slice(self, name: str) -> None:
        """Delete a `Slice`; gone is success. The slice controller dismantles it and frees its
        cubes (GKE "Use dynamic slicing with a custom scheduler", delete the slice)."""
        try:
            await self._call("delete", f"{SLICES}/{_q(name)}")
        except NotFound:
            return

    async def release_slice(self, name: str) -> None:
        """Remove a deleted `Slice`'s finalizers, as GKE's guide deletes a Slice; gone is
        success. Only Slices the operator saw deleting are released, and it never creates a
        Slice under a name it still sees."""
        try:
            await self._call(
                "patch",
                f"{SLICES}/{_q(name)}",
                payload={"metadata": {"finalizers": None}},
                headers=MERGE_PATCH,
            )
        except NotFound:
            return

    async def dry_run_create(self, body: dict[str, Any]) -> None:
        """Create `body` with ?dryRun=All: the apiserver validates, defaults and runs every
        admission webhook (JobSet's included) and persists nothing. Raises the refusal. Not
        retried here (a webhook's denial is a 403 that kopf would retry)."""
        meta = body["metadata"]
        group, _, version = str(body["apiVersion"]).rpartition("/")
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        plural = {"JobSet": "jobsets", "Job": "jobs"}[str(body["kind"])]
        await self._call(
            "post",
            f"{base}/namespaces/{_q(meta['namespace'])}/{plural}?dryRun=All&{STRICT}",
            payload=body,
            backoffs=(),
        )

    async def set_jobset_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        await self._call(
            "patch",
            f"{JOBSETS}/namespaces/{_q(namespace)}/jobsets/{_q(name)}",
            payload={"spec": {"suspend": suspend}},
            headers=MERGE_PATCH,
        )

    # -- the compile Job of spec.preflight (batch/v1) -------------------------------------------

    def _batch_job_url(self, namespace: str, name: str = "") -> str:
        return f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs" + (f"/{_q(name)}" if name else "")

    async def create_batch_job(self, body: dict[str, Any]) -> bool:
        """Create the Job; False when one of that name exists (idempotent after a crash)."""
        try:
            await self._call(
                "post", f"{self._batch_job_url(body['metadata']['namespace'])}?{STRICT}", body
            )
        except Conflict:
            return False
        return True

    async def get_batch_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call("get", self._batch_job_url(namespace, name))
        except NotFound:
            return None
        return found

    async def delete_batch_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the Job and its pod (background); only that object (a uid precondition)."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            await self._call("delete", self._batch_job_url(namespace, name), payload=options)
        except (NotFound, Conflict):
            return

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = await self._call(
            "get", f"/api/v1/namespaces/{_q(namespace)}/pods?labelSelector={_q(selector)}"
        )
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    # -- what is installed (start-up checks) -----------------------------------------------------

    async def served_versions(self, group: str) -> list[str] | None:
        """The versions of API group `group` the apiserver serves (discovery), None when it
        serves none: the group's CRDs are not installed."""
        try:
            found = await self._call("get", f"/apis/{_q(group)}", backoffs=())
        except NotFound:
            return None
        return [str(v.get("version")) for v in found.get("versions") or []]

    async def served_resources(self, group: str, version: str) -> list[str]:
        """The resources (plural names) `group`/`version` serves; none when it is not served."""
        try:
            found = await self._call("get", f"/apis/{_q(group)}/{_q(version)}", backoffs=())
        except NotFound:
            return []
        return [str(r.get("name")) for r in found.get("resources") or []]

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        """A CustomResourceDefinition by name, None when absent. A list with a field selector:
        the operator may list and watch CRDs (kopf follows them), not get them."""
        found = await self._call(
            "get", f"{CRDS}?fieldSelector={_q(f'metadata.name={name}')}", backoffs=()
        )
        items: list[dict[str, Any]] = found.get("items") or []
        return items[0] if items else None

    async def server_version(self) -> str:
        """The apiserver's gitVersion (GET /version), e.g. v1.36.3."""
        found = await self._call("get", "/version", backoffs=())
        return str(found.get("gitVersion") or "")

    async def dry_run_returned(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create `body` with ?dryRun=All and return what the apiserver would store (its
        defaults applied, fields of disabled features dropped). Raises the refusal."""
        meta = body["metadata"]
        plural = {"JobSet": "jobsets", "Job": "jobs"}[str(body["kind"])]
        group, _, version = str(body["apiVersion"]).rpartition("/")
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        url = f"{base}/namespaces/{_q(meta['namespace'])}/{plural}?dryRun=All"
        found: dict[str, Any] = await self._call("post", url, payload=body, backoffs=())
        return found

    async def apply_object(self, body: dict[str, Any], url: str) -> None:
        """Server-side apply of one object at `url` (its own path), as the operator."""
        await self._call(
            "patch",
            f"{url}?fieldManager={FIELD_MANAGER}&force=true",
            payload=body,
            headers=APPLY_PATCH,
        )

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """A Namespace (its labels: Pod Security's enforce level), None when it is gone."""
        try:
            found: dict[str, Any] = await self._call("get", f"/api/v1/namespaces/{_q(name)}")
        except NotFound:
            return None
        return found

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        """A PriorityClass (cluster-scoped), None when there is none of that name."""
        try:
            found: dict[str, Any] = await self._call(
                "get", f"/apis/scheduling.k8s.io/v1/priorityclasses/{_q(name)}"
            )
        except NotFound:
            return None
        return found

    # -- MultisliceJobs ------------------------------------------------------------------------

    def _job_url(self, namespace: str, name: str, sub: str = "") -> str:
        return f"{MSJ}/namespaces/{_q(namespace)}/{models.PLURAL}/{_q(name)}{sub}"

    async def apply_job_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Server-side apply of the whole status (the operator is its only writer; forced, so a
        status edited by hand is taken back); the job as the apiserver has it after."""
        updated: dict[str, Any] = await self._call(
            "patch",
            self._job_url(namespace, name, f"/status?fieldManager={FIELD_MANAGER}&force=true"),
            payload={
                "apiVersion": models.API_VERSION,
                "kind": models.KIND,
                "metadata": {"name": name, "namespace": namespace},
                "status": status,
            },
            headers=APPLY_PATCH,
        )
        return updated

    async def merge_job_status(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """A merge patch of the status (nulls remove keys another field manager still owns)."""
        updated: dict[str, Any] = await self._call(
            "patch",
            self._job_url(namespace, name, f"/status?fieldManager={FIELD_MANAGER}"),
            payload={"status": patch},
            headers=MERGE_PATCH,
        )
        return updated

    async def add_finalizer(self, job: dict[str, Any], finalizer: str) -> dict[str, Any]:
        """Append our finalizer, guarded by the resourceVersion read (409 if it moved)."""
        meta = job["metadata"]
        current = list(meta.get("finalizers") or [])
        if finalizer in current:
            return job
        updated: dict[str, Any] = await self._call(
            "patch",
            self._job_url(meta["namespace"], meta["name"]),
            payload={
                "metadata": {
                    "finalizers": [*current, finalizer],
                    "resourceVersion": meta.get("resourceVersion"),
                }
            },
            headers=MERGE_PATCH,
        )
        return updated

    async def remove_finalizer(self, job: dict[str, Any], finalizer: str) -> None:
        """Remove our finalizer only: a JSON patch that tests the entry it removes."""
        meta = job["metadata"]
        current = list(meta.get("finalizers") or [])
        if finalizer not in current:
            return
        i = current.index(finalizer)
        try:
            await self._call(
                "patch",
                self._job_url(meta["namespace"], meta["name"]),
                payload=[
                    {"op": "test", "path": f"/metadata/finalizers/{i}", "value": finalizer},
                    {"op": "remove", "path": f"/metadata/finalizers/{i}"},
                ],
                headers=JSON_PATCH,
            )
        except NotFound:
            return

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self._call("delete", self._job_url(namespace, name))
        except NotFound:
            return

    async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every MultisliceJob, or those of one namespace (RBAC may grant only Roles)."""
        where = f"/namespaces/{_q(namespace)}" if namespace else ""
        result = await self._call("get", f"{MSJ}{where}/{models.PLURAL}")
        items: list[dict[str, Any]] = result.get("items", [])
        return items

    # -- pods ----------------------------------------------------------------------------------

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        """Merge these annotations into the pod's; False when the pod is gone."""
        try:
            await self._call(
                "patch",
                f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}",
                payload={"metadata": {"annotations": annotations}},
                headers=MERGE_PATCH,
            )
        except NotFound:
            return False
        return True

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """The Eviction API (policy/v1): the pod gets the DisruptionTarget condition and is
        deleted (a PodDisruptionBudget may refuse: 429). False when the pod is gone."""
        try:
            await self._call(
                "post",
                f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/eviction",
                payload={
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace},
                },
                backoffs=(),
                wait_retry_after=False,  # a budget's 429 (Retry-After 10): the next pass asks
            )
        except NotFound:
            return False
        return True

    # -- Kueue ---------------------------------------------------------------------------------

    async def apply_workload_check(
        self, namespace: str, name: str, resource_version: str, check: dict[str, Any]
    ) -> None:
        """Server-side apply of this operator's own entry of status.admissionChecks, as of
        `resource_version` (409 if the Workload moved since); Kueue's entries are untouched."""
        await self._call(
            "patch",
            f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}/status"
            f"?fieldManager={CHECK_FIELD_MANAGER}&force=true",
            payload={
                "apiVersion": KUEUE_API_VERSION,
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "resourceVersion": resource_version,
                },
                "status": {"admissionChecks": [check]},
            },
            headers=APPLY_PATCH,
        )

    async def create_workload(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the job's Workload: the created object, or None when one of that name exists
        (idempotent)."""
        ns = body["metadata"]["namespace"]
        try:
            created: dict[str, Any] = await self._call(
                "post", f"{KUEUE}/namespaces/{_q(ns)}/workloads?{STRICT}", body
            )
        except Conflict:
            return None
        return created

    async def delete_workload(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete the Workload as of `resource_version` (a precondition: not one that moved)."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": resource_version},
        }
        try:
            await self._call(
                "delete", f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}", options
            )
        except (NotFound, Conflict):
            return

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call(
                "get", f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}"
            )
        except NotFound:
            return None
        return found

    async def patch_workload_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> None:
        """Merge-patch the Workload's status as of `resource_version` (409 if it moved since);
        a list given (conditions) replaces Kueue's, so it carries back every entry as read."""
        await self._call(
            "patch",
            f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}/status",
            payload={"metadata": {"resourceVersion": resource_version}, "status": status},
            headers=MERGE_PATCH,
        )

    async def adopt_workload(
        self, namespace: str, name: str, resource_version: str, owner: dict[str, Any]
    ) -> None:
        """A prebuilt Workload becomes the job's (its controller reference and job-uid label),
        as of `resource_version`: it has no owner before (MultiKueue's copies have none)."""
        await self._call(
            "patch",
            f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}",
            payload={
                "metadata": {
                    "resourceVersion": resource_version,
                    "ownerReferences": [owner],
                    "labels": {keys.KUEUE_JOB_UID: owner["uid"]},
                }
            },
            headers=MERGE_PATCH,
        )

    async def get_workload_priority_class(self, name: str) -> dict[str, Any] | None:
        """A Kueue WorkloadPriorityClass (cluster-scoped), None when there is none."""
        try:
            found: dict[str, Any] = await self._call(
                "get", f"{KUEUE}/workloadpriorityclasses/{_q(name)}"
            )
        except NotFound:
            return None
        return found

    async def set_workload_active(self, namespace: str, name: str, active: bool) -> None:
        """Kueue's Workload spec.active: false evicts it (the operator then stops the job)."""
        try:
            await self._call(
                "patch",
                f"{KUEUE}/namespaces/{_q(namespace)}/workloads/{_q(name)}",
                payload={"spec": {"active": active}},
                headers=MERGE_PATCH,
            )
        except NotFound:
            return

    async def patch_admission_check_conditions(
        self, name: str, resource_version: str, conditions: list[dict[str, Any]]
    ) -> None:
        """Replace an AdmissionCheck's status.conditions, as of `resource_version`."""
        await self._call(
            "patch",
            f"{KUEUE}/admissionchecks/{_q(name)}/status",
            payload={
                "metadata": {"resourceVersion": resource_version},
                "status": {"conditions": conditions},
            },
            headers=MERGE_PATCH,
        )

    # -- events --------------------------------------------------------------------------------

    async def post_event(
        self, job: dict[str, Any], type_: str, reason: str, message: str
    ) -> str | None:
        """A core/v1 Event on the MultisliceJob (what `kubectl describe msj` shows); its name."""
        meta = job.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        now = timestamp()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'msj')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": models.API_VERSION,
                "kind": models.KIND,
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
        }
        try:
            created = await self._call(
                "post", f"/api/v1/namespaces/{_q(ns)}/events", payload=event, backoffs=()
            )
        except ApiError as exc:  # events are best effort; never fail a reconcile on them
            log.warning("event not posted reason=%s status=%s", reason, exc.status)
            return None
        name = ((created or {}).get("metadata") or {}).get("name")
        return str(name) if name else None

    async def repeat_event(self, namespace: str, name: str, count: int) -> bool:
        """The same event again: its count and last timestamp, as client-go's event correlator
        aggregates repeats. False when it is gone (expired): post it anew."""
        try:
            await self._call(
                "patch",
                f"/api/v1/namespaces/{_q(namespace)}/events/{_q(name)}",
                payload={"count": count, "lastTimestamp": timestamp()},
                headers=MERGE_PATCH,
                backoffs=(),
            )
        except NotFound:
            return False
        except ApiError as exc:
            log.warning("event not updated name=%s status=%s", name, exc.status)
        return True

    # -- delegated authentication and authorization (the metrics endpoint) ----------------------

    async def review_token(self, token: str) -> dict[str, Any] | None:
        """A TokenReview: the user the apiserver says `token` belongs to (its status.user:
        username, uid, groups, extra), or None when it does not authenticate."""
        review = await self._call(
            "post",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            payload={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
            backoffs=(),
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        user: dict[str, Any] = status.get("user") or {}
        return user

    async def may_get(self, user: dict[str, Any], path: str) -> bool:
        """A SubjectAccessReview: may `user` (a TokenReview's) `get` the non-resource URL?"""
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": list(user.get("groups") or []),
            "nonResourceAttributes": {"path": path, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        review = await self._call(
            "post",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            payload={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
            backoffs=(),
        )
        return bool((review.get("status") or {}).get("allowed"))

    # -- leases (leader election) ----------------------------------------------------------------

    def _lease_url(self, namespace: str, name: str = "") -> str:
        base = f"{LEASES}/namespaces/{_q(namespace)}/leases"
        return f"{base}/{_q(name)}" if name else base

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = await self._call("get", self._lease_url(namespace, name))
        except NotFound:
            return None
        return lease

    async def list_node_leases(self) -> dict[str, str]:
        """Every node Lease's renewTime by node name (namespace kube-node-lease: the kubelets'
        heartbeats), from the apiserver's watch cache (resourceVersion=0: cheap, and fresh to a
        moment). Nodes without one are absent."""
        url = f"{self._lease_url(NODE_LEASES)}?resourceVersion=0"
        found = await self._call("get", url, backoffs=())
        return {
            str(item["metadata"]["name"]): str(item["spec"]["renewTime"])
            for item in found.get("items") or []
            if (item.get("spec") or {}).get("renewTime")
        }

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self._call("post", self._lease_url(namespace), payload=body)
        return created

    async def replace_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT with the resourceVersion read: a 409 means someone else wrote it first."""
        replaced: dict[str, Any] = await self._call(
            "put", self._lease_url(namespace, body["metadata"]["name"]), payload=body
        )
        return replaced


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
