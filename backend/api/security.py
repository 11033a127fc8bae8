"""Browser-facing security headers and whether this node is served over HTTPS.

The Content-Security-Policy lets a page of the node (the dashboard, Swagger UI, the admin) run
only the node's own scripts and talk only to the node: a script injected into a page (a name
a member chose, a dataset's label) cannot run, load code from elsewhere or send data away.
Styles may be inline (Element Plus sets style attributes); images may be data: and blob: URLs
(charts, model downloads).
"""

from __future__ import annotations

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


def serves_https(endpoint: str, debug: bool) -> bool:
    """Whether the node is reached over HTTPS: its published endpoint says so, and it is not a
    DEBUG node (the loopback development setup is plain http, with cookies that must work there)."""
    return endpoint.lower().startswith("https://") and not debug


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
