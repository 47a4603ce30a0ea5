"""Policy settings: one immutable dataclass the console keeps in its settings and the simulator builds per run."""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    # "console" (the full policy below), "fifo" (first come first served within priority, no reservation),
    # "fifo-backfill" (FIFO within priority with a reservation for the head and backfill behind it),
    # "fair-share" (the console's pass ordered by fair share alone, without shortest-first preemption).
    policy: str = "console"

    # Preemption. A running job may be stopped for a higher priority class of its own team, for a job of its own
    # team and class whose predicted remaining GPU-time is `srpt_preempt_ratio` times shorter, or (when it
    # borrows) for a team reclaiming its quota. The first two respect the job's protection: it runs at least
    # `min_run_before_preempt_s` each time it starts; after `max_preemptions_per_job` preemptions, each further one
    # multiplies that by `preempt_protection_growth`, up to `max_protection_s` (a rising bar that bounds what
    # preemptions cost a job, about one per max_protection_s of its run time, and never stops it for good).
    # A job preempted `max_preemptions_per_job` times no longer borrows idle GPUs beyond its team's quota.
    priority_preemption: bool = True
    srpt_preemption: bool = True
    srpt_preempt_ratio: float = 1.5
    min_run_before_preempt_s: float = 10 * 60
    # ... and no longer than this fraction of the median run time of the cluster's finished jobs, once there are
    # enough (RuntimeHistory.median_run_s; preemption.with_learned_protection): ten minutes is a fifth of a typical
    # hour-long run, but longer than most runs of a cluster of short jobs (the Pollux workloads: median 5 min),
    # where a short arrival then waits up to ten minutes behind a job that has just started. 0: the fixed minimum.
    # Never below `min_run_floor_s`: a cluster of many tiny jobs (CI smoke tests of seconds) would otherwise
    # protect nothing, and a restart (dispatch, container start, checkpoint load) costs tens of seconds.
    min_run_median_fraction: float = 0.2
    min_run_floor_s: float = 60.0
    max_preemptions_per_job: int = 3
    preempt_protection_growth: float = 2.0
    max_protection_s: float = 6 * HOUR
    # A waiting gang that declares its steps and needs at least `gang_preempt_width` times the GPUs of a running job
    # that declares its steps may stop it once that job's score (its declared size) is `gang_preempt_ratio` times
    # its own rather than `srpt_preempt_ratio` times (preemption.shorter_ratio; the protection still holds): a wide
    # gang otherwise waits for several narrow jobs to end at once, and each GPU that frees goes to a narrower job
    # first. Only where both orders rest on declarations (on attained service alone it cost Muri trace3 2 h).
    # 0: off.
    gang_preempt_width: float = 4.0
    gang_preempt_ratio: float = 1.01
    # Victim searches per pass (each scans the running jobs): bounds a pass over a long queue.
    max_preemption_searches: int = 64

    # Quotas: a team within max_gpus is guaranteed its GPUs; beyond it, preemptible jobs of teams that may borrow
    # run on idle GPUs and are reclaimed when an owner needs them.
    borrowing: bool = True

    # Order within a priority class. "shortest-remaining": estimated remaining GPU-time (ordering.estimate_service:
    # declared steps, similar runs and attained service blended by how good each has been) x fair-share penalties,
    # divided by an aging boost (1 + wait / aging_s) so that long jobs cannot starve. "fair-share": the penalties
    # alone (over the aging boost). "fifo": submit time.
    ordering: str = "shortest-remaining"
    aging_s: float = 10 * DAY
    # ... and no longer than this many times the 90th percentile of the cluster's run times (the finished jobs'
    # and, as far as they have gone, the running jobs': ordering.with_learned_aging), once enough jobs have
    # finished: ten days is four and a half long runs of the Muri traces (their 90th percentile 53 h), but a
    # month of Pollux's (under an hour), where aging then never lifts a waiting long job. 0: the fixed aging_s.
    # Never below `aging_floor_s`: a burst of tiny jobs (a CI pipeline's smoke tests) would otherwise turn the
    # order first-come first-served within minutes.
    aging_long_run_multiple: float = 4.5
    aging_floor_s: float = HOUR
    # A job that declares its steps ages this many times slower (ordering.job_aging_s): it is ordered by its whole
    # declared size, and a long one waits behind shorter ones by design.
    declared_aging_multiple: float = 6.0
    # Fair share: penalty = 2 ** (weight * usage fraction / share fraction), per team and per user in a team.
    fair_share_weight: float = 1.0
    # Half-life of usage decay (the console decays its own usage records; the simulator uses this).
    usage_half_life_s: float = 7 * DAY

    # Prediction: used when a job declares no steps, has no similar history and no time limit.
    default_runtime_s: float = 4 * HOUR

    # Gang placement: never split a gang over more hosts than the fewest that could hold it.
    consolidate: bool = True
    # Reservation and backfill: keep GPUs for the first job that cannot start (the head) from the predicted time
    # they free up, and let later jobs use them meanwhile only if predicted to end before. Off by default for
    # the console: a reservation idles GPUs, which a shortest-first queue pays for in mean completion time
    # (trace3: 52 h -> 67 h), while aging plus preemption already bring wide gangs to run (p99 below Tiresias).
    # The "fifo-backfill" policy turns it on.
    backfill: bool = False
    # Only reserve for a head that has waited this long.
    reserve_after_wait_s: float = 0.0
    # Defragmentation (defrag.py): a gang within its team's quota that the free GPUs of its type would hold, but not
    # on the fewest hosts (consolidate), gets them by moving at most `max_defrag_moves` running jobs elsewhere;
    # at most `max_defrag_searches` gangs a pass are looked at (each search copies the free GPUs).
    defragment: bool = True
    max_defrag_moves: int = 4
    max_defrag_searches: int = 4
