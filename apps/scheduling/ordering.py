"""The order of jobs within a priority class: predicted remaining GPU-time, fair share, aging.

score = remaining GPU-seconds x team penalty x user penalty / (1 + waited / aging_s); lower goes first.
The fair-share penalty follows Slurm's classic factor 2^(-usage/shares), turned into a multiplier:
2 ** (weight x usage fraction / share fraction), so a team that used exactly its share pays 2x, an idle team 1x.
"""

from __future__ import annotations

from collections import defaultdict

from apps.scheduling.types import PendingJob, RunningJob, Snapshot

MAX_EXPONENT = 30.0


def _penalty(usage: float, total_usage: float, share: float, total_share: float, weight: float) -> float:
    if weight <= 0 or total_usage <= 0 or share <= 0 or total_share <= 0:
        return 1.0
    exponent = weight * (usage / total_usage) / (share / total_share)
    return float(2.0 ** min(exponent, MAX_EXPONENT))


class FairShare:
    def __init__(self, snapshot: Snapshot, weight: float) -> None:
        quotas = snapshot.quotas
        total_usage = sum(q.recent_usage_gpu_seconds for q in quotas.values())
        total_share = sum(q.share for q in quotas.values())
        self._team = {
            team: _penalty(q.recent_usage_gpu_seconds, total_usage, q.share, total_share, weight)
            for team, q in quotas.items()
        }
        users: dict[str, set[str]] = defaultdict(set)
        jobs: tuple[PendingJob | RunningJob, ...] = (*snapshot.pending, *snapshot.running)
        for job in jobs:
            users[job.team].add(job.user)
        self._user: dict[tuple[str, str], float] = {}
        for team, q in quotas.items():
            members = users[team] | set(q.user_shares) | set(q.user_recent_usage_gpu_seconds)
            usage = q.user_recent_usage_gpu_seconds
            team_usage = sum(usage.values())
            team_shares = sum(q.user_shares.get(u, 1.0) for u in members)
            for user in members:
                self._user[(team, user)] = _penalty(
                    usage.get(user, 0.0), team_usage, q.user_shares.get(user, 1.0), team_shares, weight
                )

    def penalty(self, team: str, user: str) -> float:
        return self._team.get(team, 1.0) * self._user.get((team, user), 1.0)


def aging_boost(submitted_at: float, now: float, aging_s: float) -> float:
    if aging_s <= 0:
        return 1.0
    return 1.0 + max(0.0, now - submitted_at) / aging_s
