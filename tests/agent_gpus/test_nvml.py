"""The NVML backend: the real pynvml on this GPU-less machine, and the mapping logic against a fake NVML."""

from __future__ import annotations

import logging
import os
import threading
import time

import pynvml
import pytest

from tests.agent_gpus.conftest import Err, FakeGpu
from workers.agent.gpus import NoGpuBackend, open_backend
from workers.agent.gpus.nvml import NvmlBackend, nvml_error_name, unavailable_reason

LOGGER = "workers.agent.gpus"


def _real_nvml_missing() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return False


needs_no_driver = pytest.mark.skipif(not _real_nvml_missing(), reason="this host has a working NVIDIA driver")


# -- the real pynvml, no driver ---------------------------------------------------------------------------


@needs_no_driver
def test_real_nvml_without_driver_raises_no_gpu_backend(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    with pytest.raises(NoGpuBackend) as info:
        open_backend(None)
    message = str(info.value)
    assert message.startswith("NVML unavailable (NVMLError_")
    # No libnvidia-ml.so here: LibraryNotFound; a host with the library but no kernel module: DriverNotLoaded.
    assert "LibraryNotFound" in message or "DriverNotLoaded" in message
    assert "no NVIDIA driver on this host; use --simulate 4xH200 to run with simulated GPUs" in message
    assert isinstance(info.value.cause, pynvml.NVMLError)
    assert info.value.reason == "no NVIDIA driver on this host"
    assert any(r.levelno == logging.ERROR and "NVML unavailable" in r.getMessage() for r in caplog.records)


@needs_no_driver
def test_real_nvml_without_driver_falls_back_to_simulated(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    backend = open_backend(None, fallback_simulate="4xH200", host_name="node-x")
    try:
        assert backend.kind == "simulated"
        assert [d.name for d in backend.devices()] == ["Simulated NVIDIA H200"] * 4
    finally:
        backend.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NVML unavailable" in w and "falling back to simulated GPUs: 4xH200" in w for w in warnings)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@needs_no_driver
def test_make_runs_agent_simulates_only_without_a_driver_and_simulate_still_wins():
    from workers.agent import main

    without = main.open_gpu_backend(main.parse_args(["--name", "local", "--simulate-without-driver", "2xH200"]))
    forced = main.open_gpu_backend(main.parse_args(["--name", "local", "--simulate-without-driver", "2xH200",
                                                    "--simulate", "1xA100"]))
    try:
        assert [d.gpu_type for d in without.devices()] == ["H200", "H200"]
        assert [d.gpu_type for d in forced.devices()] == ["A100"]
    finally:
        without.close()
        forced.close()


def test_bad_fallback_spec_is_rejected_up_front():
    with pytest.raises(ValueError, match="COUNTxTYPE"):
        open_backend(None, fallback_simulate="lots of GPUs")


def test_error_naming():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert type(err).__name__ == "NVMLError_DriverNotLoaded"
    assert nvml_error_name(err) == "NVMLError_DriverNotLoaded: Driver Not Loaded"
    assert unavailable_reason(err) == "no NVIDIA driver on this host"
    mismatch = pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert "version" in unavailable_reason(mismatch)
    assert "permission" in unavailable_reason(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION))


def test_driver_not_loaded_via_fake(fake_nvml, caplog):
    nvml = fake_nvml(FakeGpu())
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(
        NoGpuBackend, match=r"NVML unavailable \(NVMLError_DriverNotLoaded: Driver Not Loaded\)"
    ):
        open_backend(None)


def test_no_gpu_at_all_is_no_backend(fake_nvml):
    fake_nvml().gpus.clear()
    with pytest.raises(NoGpuBackend, match="no GPU on this host"):
        open_backend(None)


# -- mapping logic, fake NVML ------------------------------------------------------------------------------


def test_devices_and_full_sample(fake_nvml):
    gpu = FakeGpu(fan=Err(pynvml.NVML_ERROR_NOT_SUPPORTED), reasons=0x4 | 0x20, ecc=3)
    fake_nvml(gpu)
    backend = open_backend(None)
    assert isinstance(backend, NvmlBackend) and backend.kind == "nvml"
    [device] = backend.devices()
    assert (device.index, device.name, device.gpu_type, device.memory_mb) == (0, gpu.name, "H100", 81559)
    assert backend.driver_info() == {"driver_version": "550.54.15", "cuda_version": "12.4"}
    [s] = backend.sample()
    assert s.available and s.uuid == gpu.uuid
    assert (s.utilization_pct, s.memory_bandwidth_pct) == (87.0, 41.0)
    assert (s.memory_used_mb, s.memory_total_mb) == (1024, 81559)
    assert (s.temperature_c, s.power_w, s.power_limit_w, s.sm_clock_mhz) == (64, 512.3, 700.0, 1755)
    assert s.fan_pct is None  # passively cooled: NotSupported
    assert s.throttle_reasons == ["SW power cap", "SW thermal slowdown"]
    assert s.ecc_errors_volatile == 3
    assert [(p.pid, p.memory_mb) for p in s.processes] == [(4242, 2048)]
    backend.close()


def test_unsupported_metrics_are_none_not_zero(fake_nvml):
    no = Err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake_nvml(FakeGpu(fan=no, ecc=no, util=no, power_mw=no, reasons=no, procs=no))
    [s] = open_backend(None).sample()
    assert s.available
    assert s.utilization_pct is None and s.memory_bandwidth_pct is None
    assert s.ecc_errors_volatile is None and s.power_w is None and s.fan_pct is None
    assert s.throttle_reasons == [] and s.processes == []
    assert s.temperature_c == 64


def test_fan_reported_when_present(fake_nvml):
    fake_nvml(FakeGpu(fan=55))
    assert open_backend(None).sample()[0].fan_pct == 55


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT]
)
def test_lost_gpu_gives_no_data(fake_nvml, caplog, code):
    ok, bad = FakeGpu(uuid="GPU-ok"), FakeGpu(uuid="GPU-bad")
    fake_nvml(ok, bad)
    backend = open_backend(None)
    bad.lost = code
    caplog.set_level(logging.INFO, logger=LOGGER)
    first, second = backend.sample()
    assert first.available and first.utilization_pct == 87.0
    assert not second.available and second.uuid == "GPU-bad"
    assert second.utilization_pct is None and second.temperature_c is None and second.memory_used_mb is None
    assert second.error == str(pynvml.NVMLError(code))
    assert bad.calls["util"] == 1 and "temp" not in bad.calls  # no more calls on a dead GPU this tick
    backend.sample()
    assert sum("stopped answering" in r.getMessage() for r in caplog.records) == 1  # logged once
    bad.lost = None
    assert backend.sample()[1].available
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_lost_in_a_later_call_also_gives_no_data(fake_nvml):
    gpu = FakeGpu(temp=Err(pynvml.NVML_ERROR_GPU_IS_LOST))
    fake_nvml(gpu)
    [s] = open_backend(None).sample()
    assert not s.available and s.utilization_pct is None


def test_gpu_broken_at_start_is_left_out(fake_nvml, caplog):
    fake_nvml(FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", lost=pynvml.NVML_ERROR_GPU_IS_LOST))
    backend = open_backend(None)
    assert [d.uuid for d in backend.devices()] == ["GPU-a"]
    assert "GPU 1 left out" in caplog.text


def test_process_list_read_at_most_every_5_s(fake_nvml):
    gpu = FakeGpu()
    fake_nvml(gpu)
    now = [1000.0]
    backend = NvmlBackend(monotonic=lambda: now[0], clock=lambda: now[0] + 1e9)
    s1 = backend.sample()[0]
    assert gpu.calls["procs"] == 1 and s1.processes_ts == 1000.0 + 1e9
    gpu.procs = [(4242, 2048 * 1024 * 1024), (777, None)]
    now[0] += 4.9
    s2 = backend.sample()[0]
    assert gpu.calls["procs"] == 1  # cached
    assert [p.pid for p in s2.processes] == [4242] and s2.processes_ts == s1.processes_ts
    now[0] += 0.2
    s3 = backend.sample()[0]
    assert gpu.calls["procs"] == 2
    assert [(p.pid, p.memory_mb) for p in s3.processes] == [(4242, 2048), (777, None)]
    # Attaching a job refreshes at the next sample, so a new job's process shows up at once.
    now[0] += 1
    backend.attach_job(0, job_id=9, pid=777)
    backend.sample()
    assert gpu.calls["procs"] == 3
    assert backend.attached(0) == {9: 777}
    backend.detach_job(0, 9)
    assert backend.attached(0) == {}


def test_old_drivers_use_throttle_reasons(fake_nvml, monkeypatch):
    gpu = FakeGpu(reasons=0x1)
    fake_nvml(gpu)

    def missing(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", missing)
    backend = open_backend(None)
    assert backend.sample()[0].throttle_reasons == ["GPU idle"]
    assert backend.sample()[0].throttle_reasons == ["GPU idle"]
    assert gpu.calls["throttle_reasons"] == 2


def test_xid_events(fake_nvml):
    a, b = FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")
    nvml = fake_nvml(a, b)
    backend = open_backend(None)
    assert backend.poll_xid_events(10) == []
    assert nvml.registered == [a, b] and nvml.waits == [10]
    nvml.push_xid(b, 79)
    nvml.push_xid(a, 48)
    events = backend.poll_xid_events(1000)
    assert [(e.index, e.uuid, e.xid) for e in events] == [(1, "GPU-b", 79), (0, "GPU-a", 48)]
    assert nvml.waits[1:] == [1000, 0, 0]  # waits once, then drains what is queued


def test_xid_events_not_supported_logged_once(fake_nvml, caplog):
    nvml = fake_nvml()
    nvml.event_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend(None)
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert backend.poll_xid_events(1) == []
    assert backend.poll_xid_events(1) == []
    assert sum("XID events unavailable" in r.getMessage() for r in caplog.records) == 1
    assert nvml.waits == []


def test_xid_registration_not_supported(fake_nvml, caplog):
    nvml = fake_nvml()
    nvml.register_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert open_backend(None).poll_xid_events(1) == []
    assert "XID events unavailable" in caplog.text and nvml.waits == []


def test_fork_handler_reinitialises_nvml(fake_nvml, monkeypatch):
    registered = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: registered.append(kw))
    gpu = FakeGpu()
    nvml = fake_nvml(gpu)
    backend = open_backend(None)
    assert nvml.inits == 1 and len(registered) == 1 and set(registered[0]) == {"after_in_child"}
    backend.sample()
    assert nvml.inits == 1  # initialised once, not per call
    registered[0]["after_in_child"]()  # what the child of a fork runs
    assert nvml.inits == 1  # nothing happens in the fork handler itself...
    backend.sample()
    assert nvml.inits == 2  # ...the child re-initialises before its first call
    backend.sample()
    assert nvml.inits == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_real_fork_reinitialises_in_child(fake_nvml):
    nvml = fake_nvml()
    backend = open_backend(None)
    pid = os.fork()
    if pid == 0:  # child
        try:
            backend.sample()
            os._exit(0 if nvml.inits == 2 else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert nvml.inits == 1  # the parent keeps its NVML as it was


def test_close_shuts_nvml_down_once(fake_nvml):
    nvml = fake_nvml()
    backend = open_backend(None)
    backend.poll_xid_events(0)
    backend.close()
    backend.close()
    assert nvml.shutdowns == 1
    with pytest.raises(RuntimeError, match="closed"):
        backend.sample()
    assert backend.poll_xid_events(10_000) == []  # at once: a poller thread just ends


def test_close_waits_for_a_poll_in_progress(fake_nvml, monkeypatch):
    fake_nvml()
    backend = open_backend(None)
    order = []
    waiting = threading.Event()

    def slow_wait(event_set, timeout_ms):
        waiting.set()
        time.sleep(0.3)
        order.append("wait done")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", slow_wait)
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda event_set: order.append("freed"))
    poller = threading.Thread(target=backend.poll_xid_events, args=(300,))
    poller.start()
    waiting.wait(5)
    backend.close()
    poller.join(5)
    assert order == ["wait done", "freed"]


def test_fault_file_with_nvml_is_ignored_loudly(fake_nvml, caplog, tmp_path):
    fake_nvml()
    assert open_backend(None, fault_file=tmp_path / "f.json").kind == "nvml"
    assert "fault injection needs simulated GPUs" in caplog.text
