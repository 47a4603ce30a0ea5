"""A thin client for the console's REST API: JSON in and out, errors turned into readable CliErrors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import httpx

from workers.cli.errors import EXIT_USAGE, ApiError, CliError, Unreachable, detail_of, format_field_errors

API_PREFIX = "/api/v1/"
USER_AGENT = "gpuctl/0.1"
DEFAULT_TIMEOUT_S = 30.0
MAX_PAGE_SIZE = 500
UPLOAD_TIMEOUT_S = 600.0  # a code snapshot of up to 100 MB over a slow uplink


def _timeout() -> float:
    try:
        return float(os.environ.get("GPUCTL_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


class Api:
    """`Api(url, token).get("jobs/12/")`: paths are relative to `{url}/api/v1/`."""

    def __init__(self, url: str, token: str | None = None, *, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url
        self.timeout = _timeout()
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=url + API_PREFIX, headers=headers, timeout=self.timeout, transport=transport
        )

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def endpoint(self, path: str) -> str:
        return self.url + API_PREFIX + path.lstrip("/")

    def request(self, method: str, path: str, *, params: Any = None, json: Any = None,
                data: dict[str, str] | None = None, files: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        where = self.endpoint(path)
        limit = timeout or self.timeout
        try:
            response = self._http.request(method, path.lstrip("/"), params=params, json=json, data=data,
                                          files=files, timeout=limit)
        except httpx.TimeoutException:
            raise Unreachable(f"{method} {where} timed out after {limit:g} s") from None
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the console at {self.url} ({method} {where}): {exc or type(exc).__name__}") from None
        if response.is_success:
            return _json_body(response, where) if response.content else None
        raise error_for(response, method, where, self.url)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v not in (None, [], "")})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def upload(self, path: str, *, fields: dict[str, str], files: dict[str, tuple[str, BinaryIO, str]]) -> Any:
        """A multipart POST (form fields and files), with a longer timeout than plain requests get."""
        return self.request("POST", path, data=fields, files=files, timeout=max(self.timeout, UPLOAD_TIMEOUT_S))

    def paginate(self, path: str, *, limit: int, **params: Any) -> Iterator[dict[str, Any]]:
        """Items of a paginated list (`{count, next, results}`), at most `limit` of them."""
        page, seen = 1, 0
        while seen < limit:
            body = self.get(path, page=page, page_size=min(limit, MAX_PAGE_SIZE), **params)
            if isinstance(body, list):  # an unpaginated list
                yield from body[: limit - seen]
                return
            results = body.get("results", []) if isinstance(body, dict) else []
            for item in results[: limit - seen]:
                yield item
                seen += 1
            if not body.get("next") or not results:
                return
            page += 1


def _json_body(response: httpx.Response, where: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise CliError(
            f"{where} did not answer JSON (HTTP {response.status_code}); is this the console's address?"
        ) from None


def error_for(response: httpx.Response, method: str, where: str, base: str) -> ApiError:
    status = response.status_code
    try:
        payload: Any = response.json()
    except ValueError:
        payload = None
    detail = detail_of(payload)
    if status == 400:
        lines = format_field_errors(payload) if payload is not None else [response.text[:300]]
        message = "the console refused the request:\n" + "\n".join(f"  {line}" for line in lines)
        return ApiError(message, status=status, payload=payload, exit_code=EXIT_USAGE)
    if status == 401:
        message = f"not logged in to {base}: {detail or 'authentication required'}. Run `gpuctl login`"
        message += " (or set GPUCTL_URL and GPUCTL_TOKEN)."
    elif status == 403:
        message = f"permission denied: {detail or method + ' ' + where}"
    elif status == 404:
        message = f"not found: {method} {where}" + (f" ({detail})" if detail and detail != "Not found." else "")
    elif status == 429:
        retry = response.headers.get("Retry-After")
        message = f"the console is rate-limiting requests{f'; retry in {retry} s' if retry else ''}: {detail}"
    elif status >= 500:
        message = f"the console failed on {method} {where} (HTTP {status})" + (f": {detail}" if detail else "")
    else:
        message = detail or f"{method} {where} answered HTTP {status}"
    return ApiError(message, status=status, payload=payload)

