"""Test settings: the real settings with a faster password hasher and a broker that needs nothing.

CELERY_BROKER_URL / DATABASE_URL / REDIS_URL from the environment still apply (CI's PostgreSQL + Redis run).
"""

import os

os.environ.setdefault("CELERY_BROKER_URL", "memory://")

from console.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
