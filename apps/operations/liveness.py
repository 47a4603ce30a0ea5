"""Host liveness: what follows a heartbeat (a host back, jobs its agent no longer runs) and a silence (a lost
host's jobs requeued or failed, alerts either way), and the grace after the console itself was down."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache

from apps.cluster.models import Host
from apps.cluster.services import host_heartbeat, hosts_mark_lost
from apps.jobs.models import Job
from apps.jobs.services import job_host_lost, jobs_missing_on_host
from apps.telemetry.alerts import check_hosts, host_heard_from

logger = logging.getLogger(__name__)

# The names they had in apps.jobs.services: a running console's cache keeps its meaning across the upgrade.
REAPER_LAST_RUN_KEY = "jobs:reaper-last-run"
REAPER_GRACE_UNTIL_KEY = "jobs:reaper-grace-until"


def reaper_outage_grace(interval_s: float) -> bool:
    """True while hosts must not be declared lost because the console itself was not listening.

    When the reaper has not completed for several intervals (the database or the worker was down), the agents'
    heartbeats had nowhere to go: every host looks silent. Each gets one full heartbeat timeout to report again
    before it counts as lost. An empty cache (first start, Redis restarted) counts as such a gap.
    """
    now = time.time()
    last_run = cache.get(REAPER_LAST_RUN_KEY)
    if last_run is None or now - last_run > max(3 * interval_s, 15.0):
        timeout_s = settings.HEARTBEAT_TIMEOUT_S
        cache.set(REAPER_GRACE_UNTIL_KEY, now + timeout_s, timeout=int(timeout_s) + 60)
        logger.warning("the reaper has not run since %s: hosts get %.0f s to send a heartbeat before they count "
                       "as lost", "the start" if last_run is None else f"{now - last_run:.0f} s ago",
                       timeout_s)
        return True
    grace_until = cache.get(REAPER_GRACE_UNTIL_KEY)
    return grace_until is not None and now < grace_until


def reaper_completed() -> None:
    cache.set(REAPER_LAST_RUN_KEY, time.time(), timeout=None)


def host_heartbeat_received(host: Host, running: list[tuple[int, int]]) -> bool:
    """A heartbeat from `host`'s agent listing the (job id, attempt) pairs it runs. True if the host was down."""
    came_back = host_heartbeat(host)
    # Whether or not this heartbeat brought the host back (a restarted agent's registration already did): a host
    # heard from has no missing heartbeats.
    host_heard_from(host)
    jobs_missing_on_host(host, running)
    return came_back


def jobs_on_lost_hosts() -> list[tuple[int, str]]:
    """Mark hosts without heartbeats down and fail or requeue their jobs. Returns (job id, outcome) pairs."""
    outcomes = []
    lost = hosts_mark_lost()
    if lost:
        check_hosts()
    for host in lost:
        job_ids = (
            Job.objects.filter(state__in=Job.HOLDING_STATES, allocations__gpu__host=host,
                               allocations__released_at__isnull=True)
            .values_list("pk", flat=True)
            .distinct()
        )
        for job_id in job_ids:
            outcome = job_host_lost(job_id, host)
            if outcome:
                outcomes.append((job_id, outcome))
    return outcomes
