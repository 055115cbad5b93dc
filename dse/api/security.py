"""Security headers on every response (an ASGI middleware, outermost, so that the fast
reads, errors and static files carry them too).

- ``X-Content-Type-Options: nosniff``: a browser takes a response as the type it says (a
  trial's reason or a study name in JSON is never run as a script or a page).
- ``Referrer-Policy: no-referrer``: the dashboard's study and trial addresses are not sent
  to other sites.
- ``X-Frame-Options: DENY`` and ``frame-ancestors 'none'``: no other site frames the
  dashboard (clickjacking of its stop button).
- ``Content-Security-Policy``: the dashboard runs only its own scripts (``/static``: its
  JavaScript and the vendored plotly.js) and talks only to its own origin; plotly.js writes
  inline styles, so styles may be inline. The one inline event handler of ``index.html``
  (it notes that plotly.js failed to load) is allowed by its hash. API answers (JSON) get a
  policy that allows nothing. The interactive API docs (``/api/v1/docs``: Swagger UI from
  its CDN, with an inline script) are left without a policy.
"""

from __future__ import annotations

import base64
import hashlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SecurityHeaders", "DASHBOARD_CSP", "API_CSP", "INLINE_HANDLERS"]

#: The inline event handlers of dse/api/static/index.html, allowed by their hash.
INLINE_HANDLERS = ("window.dsePlotlyFailed = true",)


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


DASHBOARD_CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-hashes' " + " ".join(_hash(h) for h in INLINE_HANDLERS),
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
API_CSP = "default-src 'none'; frame-ancestors 'none'"

_COMMON = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """ASGI middleware adding the headers above; ``docs_prefix``: the API docs' paths (no
    content security policy there), ``api_prefix``: the API's (the policy that allows
    nothing)."""

    def __init__(self, app: ASGIApp, *, api_prefix: str, docs_prefix: str) -> None:
        self.app = app
        self.api_prefix = api_prefix
        self.docs_prefix = docs_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(self.docs_prefix):
            csp = None
        elif path.startswith(self.api_prefix):
            csp = API_CSP.encode()
        else:
            csp = DASHBOARD_CSP.encode()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in _COMMON if k not in have]
                if csp is not None and b"content-security-policy" not in have:
                    headers.append((b"content-security-policy", csp))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
