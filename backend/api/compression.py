"""Gzip for JSON answers (the rounds list of a live job, polled every 3 s, shrinks about five times).

Only JSON and the OpenAPI schema: the dashboard's assets come precompressed from WhiteNoise, and
blobs and model files are streamed as they are (encrypted bytes do not compress). Django's
middleware adds random bytes to each gzip header, which blunts BREACH against the secrets an
answer may carry (a login's token).
"""

from __future__ import annotations

from django.middleware.gzip import GZipMiddleware

COMPRESSED_TYPES = ("application/json", "application/vnd.oai.openapi")


class JsonGZipMiddleware(GZipMiddleware):
    def process_response(self, request, response):
        if response.streaming or not response.get("Content-Type", "").startswith(COMPRESSED_TYPES):
            return response
        return super().process_response(request, response)
