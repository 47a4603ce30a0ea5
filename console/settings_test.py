"""Test settings: the real settings with a faster password hasher and a broker that needs nothing.

CELERY_BROKER_URL / DATABASE_URL / REDIS_URL from the environment still apply (CI's PostgreSQL + Redis run).
"""

import os
import tempfile

os.environ.setdefault("CELERY_BROKER_URL", "memory://")
# The concurrency tests run 20 threads that each hold a connection for the whole test.
os.environ.setdefault("CONSOLE_DB_POOL_SIZE", "40")
# Tests never read or write the dev server's artifacts.
os.environ.setdefault("CONSOLE_ARTIFACTS", tempfile.mkdtemp(prefix="console-test-artifacts-"))

from console.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if not REDIS_URL:  # noqa: F405 - one test process: an in-memory cache, never the dev server's files
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
