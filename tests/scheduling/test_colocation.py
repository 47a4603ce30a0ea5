"""The pairing decision of measured-utilization packing (apps/scheduling/colocation.py)."""

from __future__ import annotations

import pytest

from apps.scheduling.colocation import (
    ColocationConfig,
    Guest,
    Measured,
    Resident,
    choose_pairs,
    measured_slowdown,
    predicted_slowdown,
    should_split,
)

CONFIG = ColocationConfig()
GPU_MB = 80_000


def measured(job_id: int, util: float | None = 20.0, *, samples: int = 30, memory: int | None = 4000,
             wait: float | None = None, step: float | None = 0.5) -> Measured:
    return Measured(job_id=job_id, utilization_pct=util, samples=samples if util is not None else 0,
                    memory_mb=memory, wait_fraction=wait, step_s=step)


def resident(job_id: int, gpu_id: int, util: float = 20.0, **kw) -> Resident:
    avoid = kw.pop("avoid", frozenset())
    return Resident(measured(job_id, util, **kw), gpu_id=gpu_id, gpu_memory_mb=GPU_MB, avoid=avoid)


def guest(job_id: int, util: float | None = 20.0, **kw) -> Guest:
    avoid = kw.pop("avoid", frozenset())
    return Guest(measured(job_id, util, **kw), avoid=avoid)


def test_two_low_utilization_jobs_pair_with_a_reason():
    [pair] = choose_pairs([resident(1, 10, 22.0)], [guest(2, 18.0)], CONFIG)
    assert (pair.resident, pair.guest, pair.gpu_id) == (1, 2, 10)
    assert pair.predicted_slowdown == pytest.approx(1.05)  # GPU busy 0.4 of a round: only the switch overhead
    assert "both measured under 30 % utilization (22 % and 18 %)" in pair.reason


def test_busy_jobs_are_not_paired():
    assert choose_pairs([resident(1, 10, 80.0)], [guest(2, 10.0)], CONFIG) == []  # resident keeps its GPU busy
    assert choose_pairs([resident(1, 10, 20.0)], [guest(2, 75.0)], CONFIG) == []  # guest measured busy


def test_a_resident_must_be_measured_long_enough():
    assert choose_pairs([resident(1, 10, 20.0, samples=3)], [guest(2)], CONFIG) == []


def test_an_unmeasured_guest_is_a_trial_at_the_threshold():
    [pair] = choose_pairs([resident(1, 10, 20.0)], [guest(2, None, memory=None)], CONFIG)
    assert "job 2 not measured yet (a trial)" in pair.reason


def test_an_unknown_step_time_is_taken_as_the_neighbours():
    # A guest that never reported its steps alone: neither faster nor slower than the resident.
    [pair] = choose_pairs([resident(1, 10, 6.0, step=0.5, wait=0.78)], [guest(2, None, memory=None, step=None)],
                          CONFIG)
    assert pair.predicted_slowdown == pytest.approx(1.05)


def test_the_runtime_wait_fraction_counts_when_it_says_more_compute_than_telemetry():
    low = measured(1, 20.0, wait=0.1)  # the runtime waits only 10 % of each step: 90 % busy
    assert predicted_slowdown(low, measured(2, 20.0), CONFIG) == pytest.approx(1.1 * 1.05 / 1.0, rel=0.01)
    assert choose_pairs([Resident(low, gpu_id=10, gpu_memory_mb=GPU_MB)], [guest(2, 25.0, wait=0.2)], CONFIG) == []


def test_memory_must_fit_in_half_the_gpu():
    assert choose_pairs([resident(1, 10, memory=39_000)], [guest(2)], CONFIG) == []  # over 0.9 x 40 GB
    assert choose_pairs([resident(1, 10)], [guest(2, memory=50_000)], CONFIG) == []
    unknown = Resident(measured(1), gpu_id=10, gpu_memory_mb=0)
    assert choose_pairs([unknown], [guest(2)], CONFIG) == []


def test_a_split_pair_is_never_formed_again():
    assert choose_pairs([resident(1, 10, avoid=frozenset({2}))], [guest(2)], CONFIG) == []
    assert choose_pairs([resident(1, 10)], [guest(2, avoid=frozenset({1}))], CONFIG) == []


def test_each_gpu_takes_one_guest_and_guests_get_the_least_slowing_resident():
    residents = [resident(1, 10, 28.0, step=1.0), resident(3, 30, 5.0, step=1.0)]
    pairs = choose_pairs(residents, [guest(2, 29.0, step=1.0), guest(4, 29.0, step=1.0), guest(5)], CONFIG)
    assert [(p.guest, p.resident) for p in pairs] == [(2, 3), (4, 1)]  # the first in queue gets the idlest GPU


def test_step_times_matter_a_short_step_beside_a_long_one():
    # A 0.1 s step beside a 1 s step: one joint round lasts the long step, the short job runs ~10x slower.
    assert choose_pairs([resident(1, 10, 20.0, step=1.0)], [guest(2, 20.0, step=0.1)], CONFIG) == []


def test_measured_slowdown_and_the_split_rule():
    assert measured_slowdown(0.5, 0.56) == pytest.approx(1.12)
    assert measured_slowdown(None, 0.5) is None
    assert not should_split([1.12, 1.2], [10, 10], CONFIG)
    assert should_split([1.1, 1.8], [10, 10], CONFIG)
    assert not should_split([1.1, 1.8], [10, 2], CONFIG)  # too few paired reports to trust it yet
    assert not should_split([None, None], [10, 10], CONFIG)
