"""Who may talk to the server: an ASGI middleware in front of every route.

Rules, in the order they are checked:
- The Host header must name the address the server is bound to (a loopback bind answers to
  127.0.0.1, localhost and [::1]): a DNS-rebinding page's requests carry its own host name. A bind
  to every interface (0.0.0.0, ::) cannot know its names and takes any Host.
- A browser's cross-origin request (an Origin other than the server's own, or Sec-Fetch-Site
  cross-site / same-site) is refused: a text/plain or form POST from a web page needs no CORS
  preflight, so without this any page could make the server generate.
- With an API key, every route but /health wants `Authorization: Bearer KEY` (compared in
  constant time). The key is never printed, logged or written anywhere.
Each refusal is a JSON error in OpenAI's shape.
"""

from __future__ import annotations

import hmac
import json
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ANY = {"0.0.0.0", "::", ""}  # noqa: S104 - the bind address, not one we choose


def allowed_hosts(bind: str) -> set[str] | None:
    """Host names (without port) a request to a server bound to `bind` may carry; None: any."""
    bind = bind.strip("[]").lower()
    if bind in ANY:
        return None
    return set(LOOPBACK) if bind in LOOPBACK else {bind}


def host_of(value: str) -> str:
    """'example.com:8000' / '[::1]:8000' / 'http://x:1' -> the bare lower-case host."""
    if "//" not in value:
        value = "//" + value
    try:
        return (urlsplit(value).hostname or "").lower()
    except ValueError:
        return "\0invalid"


def error_body(status: int, message: str, type_: str, code=None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code or status}}).encode()


class Guard:
    def __init__(self, app, bind: str = "127.0.0.1", api_key: str | None = None):
        self.app, self.hosts, self.api_key = app, allowed_hosts(bind), api_key

    def refusal(self, scope) -> tuple[int, str, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = host_of(headers.get("host", ""))
        if self.hosts is not None and "host" in headers and host not in self.hosts:
            return (400, "Invalid Host header: this server answers only to the address it is bound to",
                    "invalid_request_error")
        origin = headers.get("origin")
        cross = origin is not None and origin != "null" and host_of(origin) != host
        if cross or origin == "null" or headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return 403, "cross-origin requests are refused (this server sends no CORS headers)", "permission_error"
        if self.api_key and scope.get("path") != "/health":
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return 401, "Incorrect or missing API key: send `Authorization: Bearer KEY`", "authentication_error"
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (refused := self.refusal(scope)) is not None:
            status, message, type_ = refused
            body = error_body(status, message, type_)
            extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
