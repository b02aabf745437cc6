"""Whose is it? One pure rule for every object the operator matches to a job: node pools, JobSets
and pods, read by observe, the reconciler, the appliers, the orphan sweep and the GKE adapter.

Labels say who made an object and for which job (namespace/name); only the owner's uid says which
incarnation of that job. A job deleted and recreated under the same name (Argo CD's
`Force=true,Replace=true`, or a delete and apply within the garbage collector's window) must never
adopt its predecessor's JobSet, restarts and completion, nor its pools: those are orphans, to be
released, never used.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

JobKey = tuple[str, str]  # (namespace, name)


class Owner(StrEnum):
    MINE = "Mine"  # made by this operator for this very job (its uid)
    ORPHAN = "Orphan"  # made by this operator for a job that no longer exists (an earlier
    # incarnation of this name, or a deleted job): released, never used
    OTHER_JOB = "OtherJob"  # another live job's, or a job this operator cannot see: never touched
    STRANGER = "Stranger"  # not made by this operator: never touched


def owner_of(
    *,
    made_by_us: bool,
    claim_uid: str | None,
    claim_key: JobKey | None,
    job_key: JobKey,
    job_uid: str,
    live_jobs: Mapping[JobKey, str] | None = None,
    complete: bool = False,
) -> Owner:
    """The owner of an object whose labels/ownerReferences claim (`claim_key`, `claim_uid`), as
    seen by the job (`job_key`, `job_uid`). `live_jobs`: the uid of each job the operator sees;
    `complete`: it is every job there is (a fresh listing), so a job missing from it is gone (a
    watch cache may not have caught up: a job missing from it could just be new). Without
    certainty another job's object is never taken for an orphan."""
    if not made_by_us:
        return Owner.STRANGER
    if claim_uid and claim_uid == job_uid:
        return Owner.MINE
    if claim_key is None or claim_key == job_key:
        # Our name, another uid (or none recorded): this job's predecessor made it.
        return Owner.ORPHAN
    return Owner.ORPHAN if orphaned(claim_uid, claim_key, live_jobs, complete) else Owner.OTHER_JOB


def orphaned(
    claim_uid: str | None,
    claim_key: JobKey,
    live_jobs: Mapping[JobKey, str] | None,
    complete: bool = False,
) -> bool:
    """Whether the job an object of ours was made for is gone: no job of that name, or one of
    another uid (recreated since). Only a complete listing can say a job is gone."""
    uid = live_jobs.get(claim_key) if live_jobs is not None else None
    if uid is None:
        return complete and live_jobs is not None
    return bool(claim_uid) and uid != claim_uid  # no uid recorded: it cannot be told
