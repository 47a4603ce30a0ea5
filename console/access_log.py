"""A readable `make run`: the ASGI server's access log leaves out the machines' own posts.

Every agent posts heartbeats, telemetry, job status and log chunks, and every running job its progress, several
times a second: one access-log line each buried everything else. Those lines are dropped unless
CONSOLE_ACCESS_LOG_AGENTS=1; people's requests (pages, the API, errors) are still logged, and so is any answer of
4xx or 5xx to a machine's post.
"""

from __future__ import annotations

import logging

from console.env import env_bool

# Posted by the host agent (/api/v1/agent/...) and by a job's runtime (/api/v1/job/progress/).
MACHINE_POSTS = ("/api/v1/agent/", "/api/v1/job/progress/")
ACCESS_LOGGER = "uvicorn.access"


class QuietMachinePosts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access line: '%s - "%s %s HTTP/%s" %d' % (client, method, path, http version, status)
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        method, path, status = args[1], args[2], args[4]
        quiet = (
            method == "POST"
            and isinstance(path, str)
            and path.startswith(MACHINE_POSTS)
            and isinstance(status, int)
            and status < 400
        )
        return not quiet


def install() -> None:
    """Once (the ASGI module may be imported again under --reload); nothing when CONSOLE_ACCESS_LOG_AGENTS=1."""
    if env_bool("CONSOLE_ACCESS_LOG_AGENTS", False):
        return
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, QuietMachinePosts) for f in logger.filters):
        logger.addFilter(QuietMachinePosts())
