"""The gateway: `POST /serve/<team>/<service>/predict` → a ready replica (least outstanding requests).

Authenticated with the same API tokens (`Authorization: Bearer …`), checked against the team's roles (another
team's service answers 404). A replica that fails is retried once on another; with none ready the answer is 503
with the reason. The view is async, so a slow replica holds no server thread.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

import httpx
from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from apps.serving import selectors
from apps.serving.services import ready_replicas

AUTH_CACHE_S = 10.0
REPLICA_TIMEOUT_S = 30.0
_outstanding: dict[str, int] = defaultdict(int)
_auth_cache: dict[str, tuple[float, int | None]] = {}
_clients: dict[int, httpx.AsyncClient] = {}


def _http() -> httpx.AsyncClient:
    """One pooled client per event loop (the ASGI server has one; tests may run several)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        client = _clients[id(loop)] = httpx.AsyncClient(
            timeout=REPLICA_TIMEOUT_S, limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
    return client


def _token(request: HttpRequest) -> str | None:
    parts = request.headers.get("Authorization", "").split()
    if len(parts) == 2 and parts[0].lower() in {"bearer", "token"}:
        return parts[1]
    return None


def _user_id_for(secret: str) -> int | None:
    from apps.accounts.services import token_authenticate

    token = token_authenticate(secret)
    return token.user_id if token else None


async def _authenticate(request: HttpRequest) -> int | None:
    secret = _token(request)
    if not secret:
        return None
    cached = _auth_cache.get(secret)
    if cached and time.monotonic() - cached[0] < AUTH_CACHE_S:
        return cached[1]
    user_id = await sync_to_async(_user_id_for)(secret)
    _auth_cache[secret] = (time.monotonic(), user_id)
    return user_id


def _error(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


@csrf_exempt
@require_POST
async def predict(request: HttpRequest, team: str, service: str) -> JsonResponse:
    user_id = await _authenticate(request)
    if user_id is None:
        response = _error(401, "Send an API token: Authorization: Bearer <token>.")
        response["WWW-Authenticate"] = 'Bearer realm="serve"'
        return response
    found = await sync_to_async(selectors.service_for_gateway)(user_id, team, service)
    if found is None:
        return _error(404, f"No service {team}/{service}.")
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "The body must be JSON: {\"inputs\": [...]}.")
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list) or not body["inputs"]:
        return _error(400, "The body must be a JSON object with a non-empty list 'inputs'.")
    replicas = await sync_to_async(ready_replicas)(found.pk)
    if not replicas:
        return _error(503, f"No replica of service {team}/{service} is ready yet ({found.desired_replicas} wanted); "
                           "retry shortly.")
    order = sorted(replicas, key=lambda r: (_outstanding[r["url"]], r["job"]))
    failures = []
    for replica in order[:2]:  # the chosen replica, then one retry elsewhere
        url = replica["url"]
        _outstanding[url] += 1
        try:
            answer = await _http().post(f"{url}/predict", content=request.body,
                                        headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            failures.append(f"replica job {replica['job']}: {type(exc).__name__}")
            continue
        finally:
            _outstanding[url] -= 1
        if answer.status_code >= 500:
            failures.append(f"replica job {replica['job']}: HTTP {answer.status_code}")
            continue
        try:
            payload = answer.json()
        except ValueError:
            failures.append(f"replica job {replica['job']}: not JSON")
            continue
        response = JsonResponse(payload, status=answer.status_code, safe=False)
        response["X-Replica-Job"] = str(replica["job"])
        return response
    return _error(503, "The service's replicas failed: " + "; ".join(failures))
