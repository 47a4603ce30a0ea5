"""The gateway: `POST /serve/<team>/<service>/predict` → a ready replica (least outstanding requests).

Authenticated with the same API tokens (`Authorization: Bearer …`), checked against the team's roles (another
team's service answers 404). Tokens are looked up through the accounts app's shared token cache (short TTL; a
revocation takes effect at the next request). Replicas are called only at the URL built from their host's
registered address and their reported port, with the replica's secret, which only the console holds. A replica that fails is retried once on another; with none ready the answer is 503
with the reason. The view is async, so a slow replica holds no server thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict

import httpx
from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from apps.serving import selectors
from apps.serving.replica_auth import replica_headers, replica_url
from apps.serving.services import ready_replicas

logger = logging.getLogger(__name__)
REPLICA_TIMEOUT_S = 30.0
# Requests in flight per replica (job id); an entry goes when its count is back to 0.
_outstanding: dict[int, int] = defaultdict(int)
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


async def _authenticate(request: HttpRequest) -> int | None:
    from apps.accounts.services import token_user_id_cached

    secret = _token(request)
    if not secret:
        return None
    return await sync_to_async(token_user_id_cached)(secret)


def _callable(replicas: list[dict]) -> list[tuple[int, str, dict[str, str]]]:
    """(job, URL, headers) of each published replica whose address and port pass the checks; others are skipped."""
    targets = []
    for replica in replicas:
        try:
            url = replica_url(replica.get("address"), replica.get("port"))
            targets.append((int(replica["job"]), url, replica_headers(replica["job"], replica["attempt"])))
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("not calling replica entry %r: %s", replica, exc)
    return targets


async def _post(job: int, url: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    _outstanding[job] += 1
    try:
        return await _http().post(f"{url}/predict", content=body,
                                  headers={"Content-Type": "application/json", **headers})
    finally:
        _outstanding[job] -= 1
        if _outstanding[job] <= 0:
            del _outstanding[job]


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
    replicas = _callable(await sync_to_async(ready_replicas)(found.pk))
    if not replicas:
        return _error(503, f"No replica of service {team}/{service} is ready yet ({found.desired_replicas} wanted); "
                           "retry shortly.")
    order = sorted(replicas, key=lambda r: (_outstanding.get(r[0], 0), r[0]))
    failures = []
    for job, url, headers in order[:2]:  # the chosen replica, then one retry elsewhere
        try:
            answer = await _post(job, url, headers, request.body)
        except httpx.HTTPError as exc:
            failures.append(f"replica job {job}: {type(exc).__name__}")
            continue
        # 401: the replica does not know this attempt's secret (a stale entry): try the other one.
        if answer.status_code >= 500 or answer.status_code == 401:
            failures.append(f"replica job {job}: HTTP {answer.status_code}")
            continue
        try:
            payload = answer.json()
        except ValueError:
            failures.append(f"replica job {job}: not JSON")
            continue
        response = JsonResponse(payload, status=answer.status_code, safe=False)
        response["X-Replica-Job"] = str(job)
        return response
    return _error(503, "The service's replicas failed: " + "; ".join(failures))
