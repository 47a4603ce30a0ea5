"""gpuctl and job arrays against a real console: submit --array, status --array, cancel --array, and --wait on
every task."""

from __future__ import annotations

import json

import pytest

from apps.cluster.models import GPU
from apps.jobs import services
from apps.jobs.models import Job
from workers.cli import follow

ARRAY = ("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "--name", "sweep", "--array", "3")


def test_submit_an_array_lists_its_tasks_and_status_shows_them(console, gpuctl):
    result = gpuctl(*ARRAY)
    assert result.code == 0, result.err
    tasks = list(Job.objects.order_by("array_index"))
    assert [t.array_index for t in tasks] == [0, 1, 2] and {t.array_id for t in tasks} == {tasks[0].pk}
    assert result.out.startswith(f"Submitted job array {tasks[0].pk} (sweep, team vision): 3 tasks, jobs "
                                 f"{tasks[0].pk}-{tasks[2].pk}")
    listed = json.loads(gpuctl("status", "--array", tasks[2].pk, "--json").out)  # any task names its array
    assert [job["id"] for job in listed] == [t.pk for t in tasks]  # by index, all of them
    alone = int(gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "-q").out)
    assert gpuctl("status", "--array", alone).code == 1 and gpuctl("cancel", alone, "--array").code == 1
    assert gpuctl("status", tasks[0].pk, "--array", tasks[0].pk).code == 2  # one job, or a filtered table
    table = gpuctl("status", "--array", tasks[0].pk).out
    assert "sweep[0]" in table and "sweep[2]" in table
    detail = gpuctl("status", tasks[1].pk).out
    assert detail.startswith(f"Job {tasks[1].pk}: sweep[1] ") and f"task 1 of 3 in job array {tasks[0].pk}" in detail


def test_an_array_with_a_percent_runs_at_most_that_many_at_once(console, gpuctl):
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "--array", "4%2", "-q")
    assert result.code == 0, result.err
    tasks = Job.objects.filter(array_id=int(result.out))
    assert {(t.array_size, t.array_parallelism) for t in tasks} == {(4, 2)}
    assert "task 1 of 4 in job array" in gpuctl("status", tasks.get(array_index=1).pk).out
    assert ", at most 2 at once" in gpuctl("status", tasks.get(array_index=1).pk).out
    for bad in ("4%0", "4%", "4%x"):
        refused = gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "--array", bad)
        assert refused.code == 2 and "--array" in refused.err


def test_quiet_prints_the_array_id_and_cancel_array_cancels_the_tasks_left(console, gpuctl, world):
    array_id = int(gpuctl(*ARRAY, "-q").out)
    first = Job.objects.get(pk=array_id)
    services.job_cancel(job=first, actor=world.member, reason="done early")
    result = gpuctl("cancel", array_id + 2, "--array", "--reason", "sweep over")  # (a task's id names it too)
    assert result.code == 0, result.err
    assert result.out.strip() == f"Cancelled 2 of the 3 tasks of job array {array_id} (1 had ended)"
    assert set(Job.objects.filter(array_id=array_id).values_list("state", flat=True)) == {"cancelled"}
    assert gpuctl("cancel", 999999, "--array").code == 1


def test_wait_on_an_array_follows_every_task_and_exits_with_the_first_failure(console, gpuctl, monkeypatch):
    real_sleep = follow.sleep
    ends = iter([(True, 0), (False, 3), (True, 0)])

    def end_the_tasks(seconds: float) -> None:
        for task in Job.objects.filter(state="queued").order_by("array_index"):
            [gpu] = GPU.objects.filter(allocations__isnull=True).order_by("host__name", "index")[:1]
            assert services.job_place(task.pk, (gpu.pk,))
            succeeded, code = next(ends)
            assert services.job_finish(task.pk, succeeded=succeeded, exit_code=code, reason=f"exited with code {code}")
        real_sleep(seconds)

    monkeypatch.setattr(follow, "sleep", end_the_tasks)
    result = gpuctl(*ARRAY, "--wait", "--interval", "0.05", "--json")
    assert result.code == 3, result.err
    finals = json.loads(result.out)
    assert [(job["array_index"], job["state"], job["exit_code"]) for job in finals] == [
        (0, "succeeded", 0), (1, "failed", 3), (2, "succeeded", 0)]


@pytest.mark.parametrize("size", ["0", "-2", "many"])
def test_a_bad_array_size_is_refused_before_sending(console, gpuctl, size):
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "--array", size)
    assert result.code == 2 and "--array" in result.err
    assert not Job.objects.exists()
