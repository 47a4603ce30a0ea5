from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.types import GpuView, HostView

from .helpers import hosts, running, snapshot


def free_of(host_views, running_jobs=()):
    return FreeGpus.from_snapshot(snapshot(host_views, running_jobs=running_jobs))


def test_single_host_gang_goes_to_the_tightest_host_that_fits():
    # h0 has 2 free, h1 has 4 free: a 2-GPU gang takes h0 and keeps h1 whole.
    free = free_of(hosts(2, 4), [running(1, (0, 1))])
    assert choose_gpus(free, 2, None) == (2, 3)
    assert choose_gpus(free, 4, None) == (4, 5, 6, 7)


def test_consolidation_refuses_to_split_a_gang_that_could_fit_on_one_host():
    free = free_of(hosts(2, 4), [running(1, (0, 1)), running(2, (4, 5))])
    assert choose_gpus(free, 4, None) is None
    assert sorted(choose_gpus(free, 4, None, consolidate=False)) == [2, 3, 6, 7]


def test_wide_gang_takes_whole_hosts_first():
    free = free_of(hosts(3, 4), [running(1, (0,))])
    chosen = choose_gpus(free, 8, None)
    assert sorted(chosen) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert choose_gpus(free, 12, None) is None  # would need 3 whole hosts; h0 has only 3 free


def test_gpu_type_is_respected_and_one_type_per_gang():
    mixed = hosts(1, 2, "a100") + hosts(1, 2, "h100", first_id=2)
    free = free_of(mixed)
    assert choose_gpus(free, 2, "h100") == (2, 3)
    assert choose_gpus(free, 3, None) is None  # two of each type: never mixed
    assert choose_gpus(free, 1, "v100") is None


def test_unschedulable_gpus_and_hosts_get_nothing():
    host_views = (
        HostView("a", (GpuView(0, 0, "x", schedulable=False), GpuView(1, 1, "x"))),
        HostView("b", (GpuView(2, 0, "x"), GpuView(3, 1, "x")), schedulable=False),
    )
    free = free_of(host_views)
    assert free.count(None) == 1
    assert choose_gpus(free, 1, None) == (1,)
    assert choose_gpus(free, 2, None) is None
    free.give([0, 2])  # returning unschedulable GPUs does not make them usable
    assert free.count(None) == 1


def test_take_and_give_keep_counts_and_order():
    free = free_of(hosts(1, 4))
    free.take((1, 2))
    assert free.count("a100") == 2 and free.largest_block(None) == 2
    free.give((2, 1))
    assert choose_gpus(free, 4, "a100") == (0, 1, 2, 3)
