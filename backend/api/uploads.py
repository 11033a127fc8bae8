"""The one upload handler of every multipart request: in memory, bounded, refused while streaming.

Django's default handlers spool an upload over 2.5 MB to a temp file in the clear, so a
dataset or blob would sit unencrypted on disk until the request ends (and after a crash).
This handler keeps each file in memory and stops the request with 413 as soon as the body
passes DEFL_MAX_UPLOAD_BYTES, before more of it is read.
"""

from __future__ import annotations

import io

from django.conf import settings
from django.core.files.uploadedfile import InMemoryUploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from rest_framework import status
from rest_framework.exceptions import APIException

# Form fields and part headers around the file: a body above limit + this cannot fit.
FORM_OVERHEAD_BYTES = 64 * 1024


class UploadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "upload_too_large"

    def __init__(self, limit: int):
        super().__init__(f"the upload exceeds this node's limit of {limit} bytes (DEFL_MAX_UPLOAD_BYTES)")


class RequestTooLarge(APIException):
    """A (non-file) request body above the endpoint's bound, refused from its Content-Length."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self, limit: int):
        super().__init__(f"the request body exceeds this endpoint's limit of {limit} bytes")


class BoundedMemoryUploadHandler(FileUploadHandler):
    def __init__(self, request=None):
        super().__init__(request)
        self.limit = settings.DEFL_MAX_UPLOAD_BYTES
        self._received = 0  # all files of this request together
        self._buffer: io.BytesIO | None = None

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        if content_length and content_length > self.limit + FORM_OVERHEAD_BYTES:
            raise UploadTooLarge(self.limit)
        return None

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self._buffer = io.BytesIO()

    def receive_data_chunk(self, raw_data, start):
        self._received += len(raw_data)
        if self._received > self.limit:
            self._buffer = None
            raise UploadTooLarge(self.limit)
        # Django sends a file's chunks between new_file (which opens the buffer) and file_complete.
        assert self._buffer is not None, "a chunk arrived outside a file"
        self._buffer.write(raw_data)
        return None

    def file_complete(self, file_size):
        buffer, self._buffer = self._buffer, None
        if buffer is None:
            return None
        buffer.seek(0)
        return InMemoryUploadedFile(
            file=buffer,
            field_name=self.field_name,
            name=self.file_name,
            content_type=self.content_type,
            size=file_size,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )
