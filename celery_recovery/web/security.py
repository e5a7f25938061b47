"""Who may open the console, and the headers every response carries.

The console binds to the loopback by default.  Serving it on any other
interface is refused at start unless a token (``recovery_web_token``) or
basic-auth credentials (``recovery_web_credentials``) are set; whenever one
is set, every request must present it, whatever the interface.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from celery_recovery.core.errors import ConfigurationError

#: Cookie that keeps a token given once as ``?token=`` (so links need not carry it).
TOKEN_COOKIE = "celery_recovery_token"

#: Sent with every response: nothing loads from elsewhere, nothing frames the console.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """The secrets a request must present (none: anyone who can reach the socket)."""

    token: str | None = None
    credentials: str | None = None

    @property
    def required(self) -> bool:
        return bool(self.token or self.credentials)

    def check_bind(self, host: str) -> None:
        """Refuse a non-loopback interface without a secret, naming the settings that fix it."""
        if not is_loopback(host) and not self.required:
            raise ConfigurationError(
                f"refusing to serve the console on {host}, an interface other machines can "
                "reach, without authentication: set recovery_web_token (environment "
                "CELERY_RECOVERY_WEB_TOKEN) or recovery_web_credentials "
                "(CELERY_RECOVERY_WEB_CREDENTIALS='user:password'), or bind 127.0.0.1"
            )

    def allows(self, request: Request) -> bool:
        if not self.required:
            return True
        given = _bearer(request) or request.cookies.get(TOKEN_COOKIE)
        if self.token and given and _same(given, self.token):
            return True
        basic = _basic(request)
        return bool(self.credentials and basic and _same(basic, self.credentials))


class SecurityMiddleware:
    """Authenticate each request, allow only reads, add :data:`SECURITY_HEADERS`."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                for name, value in SECURITY_HEADERS.items():
                    headers.append((name.lower().encode(), value.encode()))
            await send(message)

        response = self._refusal(request)
        if response is not None:
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("the console is read-only", status_code=405)
        token = request.query_params.get("token")
        if token is not None and self.access.token and _same(token, self.access.token):
            # Keep the token in a cookie and drop it from the address bar and history.
            query = urlencode([(k, v) for k, v in parse_qsl(request.url.query) if k != "token"])
            clean = URL(str(request.url)).replace(query=query)
            response = RedirectResponse(clean.path + (f"?{query}" if query else ""), 303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response
        if self.access.allows(request):
            return None
        headers = {"WWW-Authenticate": 'Basic realm="celery-recovery"'}
        if not self.access.credentials:
            headers = {"WWW-Authenticate": "Bearer"}
        return PlainTextResponse("authentication required", status_code=401, headers=headers)


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _basic(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
