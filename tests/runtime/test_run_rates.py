"""Progress reports carry the run's average rates beside the last interval's, by the result's own formula."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from workers.protocol import ResultRecord, TrainingProgress
from workers.runtime import session
from workers.runtime.reporting import read_records

from .helpers import TinyMLP, tiny_loader


def test_reports_carry_run_and_interval_rates(job, monkeypatch) -> None:
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(session, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    rt = session.start(job.env("baseline-fp32"), install_signal_handler=False)
    model = TinyMLP()
    model, optimizer, loader = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader())
    step_seconds = iter([10.0, 1.0, 3.0])  # a slow first step (warm-up), then a fast and a slower one
    for x, y in rt.batches(loader):
        seconds = next(step_seconds, None)
        if seconds is None:
            break
        clock.now += seconds
        loss = F.cross_entropy(model(x), y)
        rt.backward(loss)
        assert rt.optimizer_step()
        rt.report(loss=loss)
    result = rt.finish()
    records = read_records(job.progress)
    progress = [TrainingProgress.from_message(r) for r in records if r["type"] == "progress"]
    assert [p.steps_per_s for p in progress] == pytest.approx([0.1, 1.0, 1 / 3])
    # the run after its first step: 1 step in 1 s, then 2 steps in 4 s
    assert [p.avg_steps_per_s for p in progress] == pytest.approx([0.1, 1.0, 0.5])
    assert progress[-1].avg_samples_per_s == pytest.approx(progress[-1].avg_steps_per_s * progress[-1].samples_per_s
                                                            / progress[-1].steps_per_s)
    assert result["steps_per_s"] == pytest.approx(0.5)
    final = ResultRecord.from_message(next(r for r in records if r["type"] == "result"))
    assert final.run_rates() == pytest.approx((0.5, result["samples_per_s"]))


def test_reports_say_which_share_of_the_interval_waited_on_data(job, monkeypatch) -> None:
    """The loader takes 3 s for each batch and the step 1 s: a quarter of the time computes."""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(session, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    rt = session.start(job.env("baseline-fp32"), install_signal_handler=False)
    model = TinyMLP()
    model, optimizer, loader = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader())

    class SlowLoader:
        def __init__(self, inner):
            self.inner = inner
            self.sampler = None
            self.batch_size = inner.batch_size

        def __len__(self):
            return len(self.inner)

        def __iter__(self):
            for batch in self.inner:
                clock.now += 3.0
                yield batch

    for step, (x, y) in enumerate(rt.batches(SlowLoader(loader)), start=1):
        clock.now += 1.0
        loss = F.cross_entropy(model(x), y)
        rt.backward(loss)
        assert rt.optimizer_step()
        rt.report(loss=loss)
        if step == 3:
            break
    rt.finish()
    progress = [TrainingProgress.from_message(r) for r in read_records(job.progress) if r["type"] == "progress"]
    assert [p.wait_fraction for p in progress] == pytest.approx([0.75, 0.75, 0.75])
