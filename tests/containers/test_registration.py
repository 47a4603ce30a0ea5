"""What a container agent tells the console when it registers: its runtime and its cached images."""

from __future__ import annotations

import pytest

from workers.agent import main


def test_a_podman_agent_registers_its_runtime_and_images(base_image: str, tmp_path) -> None:
    args = main.parse_args(["--name", "reg-host", "--simulate", "2xH200", "--runtime", "podman",
                            "--volume-root", str(tmp_path), "--oci-runtime", "runc"])
    backend = main.open_gpu_backend(args)
    containers = main.open_container_runtime(args, backend)
    assert containers is not None and containers.volume_roots == (tmp_path.resolve(),)
    message = main.registration(args, backend, containers).to_message()
    assert message["runtime"] == "podman"
    assert base_image in {image["name"] for image in message["images"]}


def test_the_default_runtime_is_process_with_no_images(monkeypatch) -> None:
    monkeypatch.delenv("GPU_AGENT_RUNTIME", raising=False)
    args = main.parse_args(["--name", "reg-host", "--simulate", "1xH200"])
    backend = main.open_gpu_backend(args)
    assert main.open_container_runtime(args, backend) is None
    message = main.registration(args, backend).to_message()
    assert (message["runtime"], message["images"]) == ("process", [])


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(SystemExit):
        main.parse_args(["--runtime", "lxc"])


def test_the_agent_registers_again_when_its_images_change(base_image: str, console) -> None:
    from workers.agent.client import ConsoleClient

    args = main.parse_args(["--name", "reg-host", "--simulate", "1xH200", "--runtime", "podman"])
    backend = main.open_gpu_backend(args)
    containers = main.open_container_runtime(args, backend)
    assert containers is not None
    stale = main.registration(args, backend)  # as if registered before any image was there
    client = ConsoleClient(console.url, "host-token")
    fresh = main.refresh_images(client, containers, stale)
    assert fresh is not stale and base_image in {image.name for image in fresh.images}
    assert main.refresh_images(client, containers, fresh) is fresh  # unchanged: not sent again


def test_docker_listing_entries_read_as_podman_ones() -> None:
    from workers.agent.containers import _image_records

    entry = {"ID": "d47c8b43891b", "Repository": "localhost/base", "Tag": "1", "Size": "235MB",
             "CreatedAt": "2026-12-03 11:40:36 +0000 UTC"}
    (record,) = _image_records(entry)
    assert (record.name, record.id, record.size_mb, record.created) == (
        "localhost/base:1", "d47c8b43891b", 224, "2026-12-03T11:40:36+00:00")
    assert _image_records({**entry, "Size": "1.2GB"})[0].size_mb == 1144
    assert _image_records({**entry, "Size": "?"})[0].size_mb == 0
