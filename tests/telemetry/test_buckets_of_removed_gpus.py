"""Samples of a GPU that is removed (its host deleted) before their bucket closes are dropped, not a failed write."""

import time

import pytest

from apps.telemetry import services
from apps.telemetry.models import GpuSampleBucket
from tests.factories import HostFactory, add_gpus


@pytest.mark.django_db
def test_buckets_of_a_removed_gpu_are_dropped_and_the_others_written():
    kept, removed = HostFactory(name="kept"), HostFactory(name="removed")
    add_gpus(kept, 1)
    add_gpus(removed, 1)
    ts = time.time()  # the open bucket: written at the flush below, not by the ingest
    for host in (kept, removed):
        gpu = host.gpus.get()
        services.ingest_batch(host, {"gpus": [{"index": 0, "uuid": gpu.uuid, "ts": ts, "available": True,
                                               "utilization_pct": 50.0, "memory_used_mb": 1, "memory_total_mb": 80,
                                               "temperature_c": 40, "power_w": 100.0, "processes": []}]})
    kept_gpu = kept.gpus.get()
    removed.delete()

    assert services.flush_buckets(everything=True) == 1
    assert list(GpuSampleBucket.objects.values_list("gpu_id", flat=True)) == [kept_gpu.pk]
