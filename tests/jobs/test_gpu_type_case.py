"""GPU types match whatever their case: "h200" asks for the H200s, at submission, in quotas and at placement."""

from __future__ import annotations

from apps.cluster.models import GPU, Host
from apps.cluster.services import host_register
from apps.jobs.models import Job, JobAllocation
from apps.jobs.scheduler import scheduler_pass
from apps.quotas.models import TeamQuota
from tests.conftest import train_spec
from workers.protocol import PROTOCOL_VERSION


def test_a_lower_case_type_is_accepted_stored_once_and_placed(world, client_for):
    TeamQuota.objects.filter(team=world.vision).update(allowed_gpu_types=["h200"])
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(gpu_type=" h200"), format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.gpu_type == "H200"
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "placed"
    assert JobAllocation.objects.get(job=job).gpu.gpu_type == "H200"


def test_rows_stored_in_another_case_still_match_at_placement(world, client_for):
    GPU.objects.filter(host__name="node-a").update(gpu_type="h200")  # registered before types were normalized
    GPU.objects.filter(host__name="node-b").update(health=GPU.Health.FAULTY)
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(gpu_type="H200", gpus=8), format="json")
    assert response.status_code == 201, response.json()
    scheduler_pass()
    assert Job.objects.get(pk=response.json()["id"]).state == "placed"


def test_registration_stores_the_one_spelling(world):
    host = Host.objects.get(name="node-a")
    gpus = [{"index": i, "uuid": f"GPU-node-a-{i}", "gpu_type": "h200", "memory_mb": 143_771} for i in range(8)]
    host_register(host, {"protocol": PROTOCOL_VERSION, "host": host.name, "gpus": gpus})
    assert set(GPU.objects.filter(host=host).values_list("gpu_type", flat=True)) == {"H200"}
