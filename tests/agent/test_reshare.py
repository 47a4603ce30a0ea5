"""A running job's share of its GPU changes (a shareable job gets or loses a neighbour): the memory watch follows."""

from __future__ import annotations

from workers.agent.sharing import ShareLimits, over_share, reshared_limits


def test_a_whole_gpu_job_given_a_neighbour_is_watched_at_its_half():
    limits = reshared_limits(None, 0.5, 80_000)
    assert limits == ShareLimits(share=0.5, memory_mb=40_000, mechanism="watch")
    assert over_share({7: 41_000}, {7: limits.memory_mb}) == [(7, 41_000, 40_000)]


def test_it_is_no_longer_watched_once_it_holds_the_whole_gpu_again():
    assert reshared_limits(reshared_limits(None, 0.5, 80_000), 1.0, 80_000) == ShareLimits(1.0, 80_000, "watch")
    assert reshared_limits(None, 1.0, 80_000) is None


def test_a_fraction_keeps_the_mechanism_it_started_with():
    started = ShareLimits(share=0.5, memory_mb=40_000, mechanism="allocator-cap+watch")
    assert reshared_limits(started, 1.0, 80_000) == ShareLimits(1.0, 80_000, "allocator-cap+watch")
