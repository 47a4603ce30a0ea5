"""What a job needs of its host beyond GPUs: a container runtime (a job with an image), or an agent that runs each
process job under a uid of its own (a job without an image that is given team secrets or volumes). One owner for
placement, the pass's capacity reasons, the placeability check and the pending reasons."""

from __future__ import annotations

from dataclasses import dataclass

from apps.scheduling.types import HostView, PendingJob, RunningJob


@dataclass(frozen=True, slots=True)
class HostNeed:
    key: str
    no_host: str  # the pending reason while no schedulable host meets it
    hosts: str  # the hosts that meet it, in a sentence ("the hosts that run containers")
    refusal: str  # why a host that does not meet it may not take the job


CONTAINERS = HostNeed(
    "containers",
    no_host="no host runs containers: the job's image needs a host whose agent runs podman or docker",
    hosts="the hosts that run containers",
    refusal="its host runs no containers, and the job has an image",
)
OWN_UID = HostNeed(
    "own-uid",
    no_host=("no host runs jobs under a uid of their own: a job given secrets or volumes without an image needs an "
             "agent run as root with --job-uids (or give the job an image)"),
    hosts="the hosts that run each job under a uid of its own",
    refusal="its host does not run each job under a uid of its own, and the job is given secrets or volumes",
)

NEEDS = (CONTAINERS, OWN_UID)


def host_need(job: PendingJob | RunningJob) -> HostNeed | None:
    if job.needs_containers:
        return CONTAINERS
    if job.needs_own_uid:
        return OWN_UID
    return None


def meets(host: HostView, need: HostNeed) -> bool:
    return host.runs_containers if need is CONTAINERS else host.own_uid_jobs
