"""The embedded filesystem:// broker under several producer and consumer processes (workers/broker.py)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from workers.broker import REJECTED_SUFFIX, FilesystemTransport

QUEUE = "host.node-a"


def connect(folder: Path) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False,
               "control_folder": str(folder.parent / "control")}
    return Connection("filesystem://", transport=FilesystemTransport, transport_options=options)


def produce(folder: Path, producer: int, count: int) -> None:
    with connect(folder) as connection:
        queue = connection.SimpleQueue(QUEUE)
        for number in range(count):
            # payloads big enough that a write is not one syscall's worth of luck
            queue.put({"producer": producer, "number": number, "padding": "x" * 20_000})
        queue.close()


def consume(folder: Path, results: multiprocessing.Queue, expected: int) -> None:
    taken = []
    with connect(folder) as connection:
        queue = connection.SimpleQueue(QUEUE)
        idle_polls = 0
        while idle_polls < 40:
            try:
                message = queue.get(block=True, timeout=0.05)
            except Empty:
                idle_polls += 1
                continue
            idle_polls = 0
            taken.append((message.payload["producer"], message.payload["number"]))
            message.ack()
        queue.close()
    results.put(taken)


def test_every_message_reaches_exactly_one_consumer_whole(tmp_path):
    folder = tmp_path / "broker"
    folder.mkdir()
    producers, per_producer, consumers = 4, 150, 3
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=consume, args=(folder, results, producers * per_producer))
                 for _ in range(consumers)]
    processes += [context.Process(target=produce, args=(folder, number, per_producer)) for number in range(producers)]
    for process in processes:
        process.start()
    taken = [item for _ in range(consumers) for item in results.get(timeout=120)]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0

    assert len(taken) == producers * per_producer, "a message was lost or delivered twice"
    assert set(taken) == {(p, n) for p in range(producers) for n in range(per_producer)}
    assert not [name for name in os.listdir(folder) if not name.startswith(".")], "files left behind"


def test_an_unreadable_message_is_set_aside_and_the_next_one_delivered(tmp_path, caplog):
    folder = tmp_path / "broker"
    folder.mkdir()
    (folder / f"1_broken.{QUEUE}.msg").write_bytes(b"")  # what a writer killed mid-file leaves
    with connect(folder) as connection:
        queue = connection.SimpleQueue(QUEUE)
        queue.put({"job": 7})
        message = queue.get(timeout=2)
        assert message.payload == {"job": 7}
        message.ack()
        with pytest.raises(Empty):
            queue.get(timeout=0.2)
        queue.close()
    assert (folder / f"1_broken.{QUEUE}.msg{REJECTED_SUFFIX}").exists()
    assert "not valid JSON" in caplog.text
