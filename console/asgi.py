"""ASGI entry point: HTTP through Django, websockets through Channels (session or ticket, Origin checked).

Every recipe runs this module, so it also keeps websocket tickets out of the server's logs (console/log_redaction.py).
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from console import access_log, log_redaction

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()
# After Django's own logging setup: no websocket ticket reaches a log line of the ASGI server.
log_redaction.install()
access_log.install()  # the agents' and jobs' own posts stay out of the access log (CONSOLE_ACCESS_LOG_AGENTS=1: in)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from apps.telemetry.ws_auth import websocket_auth  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": websocket_auth(URLRouter(websocket_urlpatterns)),
    }
)
