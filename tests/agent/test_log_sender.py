"""A job's output reaches the console from a thread of its own: the job never waits for the console, output the
console did not take is sent again in order, once, and what cannot be kept is said, not silently lost."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from workers.agent.client import AgentConfigError, ConsoleRejected
from workers.agent.logsender import LogSender
from workers.agent.runner import JobRunner
from workers.protocol import Dispatch, JobStatus, unseen_output

WAIT_S = 120  # a guard against hanging forever, never a figure the test measures


def appears(path: Path) -> bool:
    """Whether `path` comes to exist (written by a job) within the guard of WAIT_S."""
    seen = threading.Event()
    for _ in range(int(WAIT_S / 0.05)):
        if path.exists():
            return True
        seen.wait(0.05)
    return False


class Console:
    """Takes log posts as the console does (what it holds of a resent chunk is not stored twice); down (connection
    refused) while `down` is set, blocked while `held` is clear; with `lose_answers` set it stores a post and then
    its answer is lost."""

    def __init__(self) -> None:
        self.received: list[str] = []  # what it stored, post by post
        self.stream = 0  # characters of the stream it holds
        self.lose_answers = 0
        self.tries = 0
        self.down = threading.Event()
        self.held = threading.Event()
        self.held.set()
        self.refuse: type[Exception] | None = None
        self.statuses: list[JobStatus] = []
        self.events: list[str] = []  # "log" and the final state, in the order they arrived
        self.ended = threading.Event()
        self.tried = threading.Event()

    def send(self, offset: int, text: str, stream: str = "") -> None:
        self.tries += 1
        self.tried.set()
        assert self.held.wait(WAIT_S)
        if self.refuse is not None:
            raise self.refuse("no")
        if self.down.is_set():
            raise httpx.ConnectError("connection refused")
        unseen = unseen_output(self.stream, offset, text)
        self.stream = max(self.stream, offset + len(text))
        if unseen:
            self.received.append(unseen)
        self.events.append("log")
        if self.lose_answers:
            self.lose_answers -= 1
            raise httpx.ReadTimeout("the answer was lost")

    # The JobRunner's client
    def log(self, job_id: int, attempt: int, data: str, offset: int, stream: str) -> None:
        self.send(offset, data, stream)

    def report(self, job_id: int, status: JobStatus, *, attempts: int = 30) -> dict[str, Any]:
        self.statuses.append(status)
        if status.state != "running":
            self.events.append(status.state)
            self.ended.set()
        return {"state": status.state, "accepted": True}

    def progress(self, job_id: int, attempt: int, progress: dict[str, Any]) -> None:
        pass

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        pass


def test_output_the_console_did_not_take_is_sent_again_in_order_once(monkeypatch) -> None:
    monkeypatch.setattr("workers.agent.logsender.RETRY_FIRST_S", 0.01)
    console = Console()
    console.down.set()
    sender = LogSender(console.send, name="job 1", chunk_chars=4)
    sender.put("abcdef")
    assert console.tried.wait(WAIT_S)
    for text in ("gh", "ij", "", "k"):
        sender.put(text)  # while the console is down: queued, the caller goes on
    console.down.clear()
    assert sender.close(idle_s=WAIT_S)
    assert "".join(console.received) == "abcdefghijk"
    assert max(map(len, console.received)) <= 4  # chunks of the bound, a long put split across them
    assert console.tries > len(console.received)  # some posts failed and were made again


def test_a_chunk_stored_by_the_console_whose_answer_was_lost_is_stored_once(monkeypatch) -> None:
    monkeypatch.setattr("workers.agent.logsender.RETRY_FIRST_S", 0.01)
    console = Console()
    console.held.clear()  # the first post waits: what comes after it queues behind it
    console.lose_answers = 2
    sender = LogSender(console.send, name="job 6", chunk_chars=4)
    sender.put("abc")
    assert console.tried.wait(WAIT_S)
    sender.put("defgh")  # sent again with "abc" after the lost answer, as one chunk of four: "abcd"
    console.held.set()
    assert sender.close(idle_s=WAIT_S)
    # Stored: "abc", then of "abcd" (twice) only "d", then "efgh"; four posts.
    assert console.received == ["abc", "d", "efgh"] and console.tries == 4


def test_output_past_the_bound_is_counted_and_the_console_is_told() -> None:
    for tail, expected in (("cc", "aaaaaaaa\n[agent] 5 characters of output were not sent here (the console did "
                                  "not take them); the job's log artifact keeps them\ncc"),
                           ("", "aaaaaaaa\n[agent] 5 characters of output were not sent here")):
        console = Console()
        console.held.clear()  # the first post hangs: what comes after it waits in the sender
        sender = LogSender(console.send, name="job 2", max_pending_chars=10)
        sender.put("first\n")
        assert console.tried.wait(WAIT_S)
        sender.put("a" * 8)
        sender.put("b" * 5)  # over the bound: counted, not kept
        sender.put(tail)  # fits again: the note comes before it (or, with nothing more, at the end)
        console.held.set()
        assert sender.close(idle_s=WAIT_S)
        text = "".join(console.received)
        assert text.startswith("first\n" + expected) and "bbbbb" not in text


def test_close_gives_up_on_a_console_that_takes_nothing() -> None:
    console = Console()
    console.down.set()
    sender = LogSender(console.send, name="job 3")
    sender.put("lost to the console, kept in the artifact\n")
    assert not sender.close(idle_s=0.2)
    assert console.received == []


def test_a_refusal_ends_the_sending_and_other_errors_drop_only_their_chunk(monkeypatch) -> None:
    console = Console()
    console.refuse = AgentConfigError  # a 400: this chunk cannot be taken, the next may
    sender = LogSender(console.send, name="job 4", chunk_chars=3)
    sender.put("bad")
    assert console.tried.wait(WAIT_S)
    console.refuse = None
    sender.put("ok!")
    assert sender.close(idle_s=WAIT_S)
    text = "".join(console.received)
    assert "ok!" in text and "bad" not in text and "[agent] 3 characters of output were not sent" in text
    console = Console()
    console.refuse = ConsoleRejected  # a 409: the attempt moved on
    sender = LogSender(console.send, name="job 5")
    sender.put("one")
    assert console.tried.wait(WAIT_S)
    sender.put("two")
    assert sender.close(idle_s=WAIT_S)
    assert console.tries == 1 and console.received == []


def test_a_job_printing_more_than_its_pipe_holds_runs_on_while_the_console_does_not_answer(tmp_path: Path) -> None:
    console = Console()
    console.held.clear()  # every log post hangs until released
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True)
    done = tmp_path / "printed"
    script = (f"import sys\nfor i in range(16384): sys.stdout.write(f'{{i:07d}} ' + 'o' * 56 + '\\n')\n"
              f"sys.stdout.flush()\nopen({str(done)!r}, 'w').close()\n")  # 1 MiB, sixteen pipes' worth
    dispatch = Dispatch(job_id=6, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", script]}, time_limit_s=600)
    assert runner.start(dispatch) == "started"
    assert appears(done), "the job blocked on its output while the console did not answer"
    assert not console.received  # the job got through all its output while the console took none of it
    console.held.set()
    assert console.ended.wait(WAIT_S)
    assert console.statuses[-1].state == "succeeded"
    text = "".join(console.received)
    lines = [line for line in text.splitlines() if re.fullmatch(r"\d{7} o+", line)]
    assert lines == [f"{i:07d} " + "o" * 56 for i in range(16384)]
    assert text.splitlines()[-1].startswith("[agent] succeeded")
    assert console.events[-1] == "succeeded" and console.events.count("succeeded") == 1  # the log came first
