"""Test settings: the real settings with a faster password hasher and a broker that needs nothing.

CELERY_BROKER_URL / DATABASE_URL / REDIS_URL from the environment still apply (CI's PostgreSQL + Redis run).
"""

import os
import re
import tempfile

os.environ.setdefault("CELERY_BROKER_URL", "memory://")
# The concurrency tests run 20 threads that each hold a connection for the whole test.
os.environ.setdefault("CONSOLE_DB_POOL_SIZE", "40")
# Tests never read or write the dev server's artifacts.
os.environ.setdefault("CONSOLE_ARTIFACTS", tempfile.mkdtemp(prefix="console-test-artifacts-"))



def _redis_db_of_this_worker(url: str, offset: int) -> str:
    """Under pytest-xdist each worker has Redis databases of its own (8-15 for gw0-gw3; their live clusters take
    0-7, tests/integration/live.py), so two workers' channel groups, caches and queues never meet."""
    worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    return re.sub(r"(/\d*)?$", f"/{8 + 2 * worker + offset}", url, count=1)


if "PYTEST_XDIST_WORKER" in os.environ:
    for name, offset in (("REDIS_URL", 0), ("CELERY_BROKER_URL", 1)):
        if os.environ.get(name, "").startswith("redis"):
            os.environ[name] = _redis_db_of_this_worker(os.environ[name], offset)

from console.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if not REDIS_URL:  # noqa: F405 - one test process: an in-memory cache, never the dev server's files
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
# Every django.test.Client builds the middleware anew, and WhiteNoise's scan of the static files (finders, without
# autorefresh) took 0.2 s of CPU each time: half the fast tests' CPU. With autorefresh it finds a file when asked.
WHITENOISE_AUTOREFRESH = True
