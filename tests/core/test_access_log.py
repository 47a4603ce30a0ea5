"""`make run`'s access log leaves out the machines' posts (console/access_log.py), nothing else."""

from __future__ import annotations

import logging

import pytest

from console import access_log

# uvicorn's access line (uvicorn.protocols.http.*_impl): the format and argument order the filter reads.
FORMAT = '%s - "%s %s HTTP/%s" %d'


def line(logger: logging.Logger, method: str, path: str, status: int) -> None:
    logger.info(FORMAT, "127.0.0.1:51234", method, path, "1.1", status)


@pytest.fixture
def access(caplog):
    logger = logging.getLogger(access_log.ACCESS_LOGGER)
    before = list(logger.filters)
    caplog.set_level(logging.INFO, logger=access_log.ACCESS_LOGGER)
    yield logger, caplog
    logger.filters[:] = before


def test_agent_and_progress_posts_are_left_out_and_people_requests_kept(access, monkeypatch):
    logger, caplog = access
    monkeypatch.delenv("CONSOLE_ACCESS_LOG_AGENTS", raising=False)
    access_log.install()
    access_log.install()  # twice (an import under --reload): one filter
    assert sum(isinstance(f, access_log.QuietMachinePosts) for f in logger.filters) == 1
    line(logger, "POST", "/api/v1/agent/heartbeat/", 200)
    line(logger, "POST", "/api/v1/agent/telemetry/", 202)
    line(logger, "POST", "/api/v1/job/progress/", 200)
    line(logger, "GET", "/jobs/", 200)
    line(logger, "POST", "/api/v1/jobs/", 201)
    line(logger, "POST", "/api/v1/agent/heartbeat/", 401)  # a refused agent is worth a line
    assert [r.getMessage().split('"')[1] for r in caplog.records] == [
        "GET /jobs/ HTTP/1.1",
        "POST /api/v1/jobs/ HTTP/1.1",
        "POST /api/v1/agent/heartbeat/ HTTP/1.1",
    ]


def test_the_environment_turns_them_back_on(access, monkeypatch):
    logger, caplog = access
    monkeypatch.setenv("CONSOLE_ACCESS_LOG_AGENTS", "1")
    logger.filters[:] = [f for f in logger.filters if not isinstance(f, access_log.QuietMachinePosts)]
    access_log.install()
    line(logger, "POST", "/api/v1/agent/heartbeat/", 200)
    assert len(caplog.records) == 1
