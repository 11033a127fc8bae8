"""An upload handler that keeps uploads in memory and stops reading past the size limit.

Datasets are parsed and encrypted from memory anyway, so nothing needs a temporary
file: with this handler an upload never touches the disk, and an over-size upload
is cut off after ``limit`` bytes instead of being read to the end.
"""

from __future__ import annotations

import io

from django.core.files.uploadedfile import InMemoryUploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopUpload


class SizeLimitedMemoryUploadHandler(FileUploadHandler):
    def __init__(self, request, limit: int):
        super().__init__(request)
        self.limit = limit
        self.too_large = False
        self._buffer: io.BytesIO | None = None
        self._size = 0

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        # The form fields add a few hundred bytes; a body far above the limit cannot fit.
        # (StopUpload is only caught once the parser reads parts, so it is raised in new_file.)
        if content_length and content_length > self.limit + 64 * 1024:
            self.too_large = True

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        if self.too_large:
            raise StopUpload(connection_reset=False)
        self._buffer = io.BytesIO()
        self._size = 0

    def receive_data_chunk(self, raw_data, start):
        self._size += len(raw_data)
        if self._size > self.limit:
            self.too_large = True
            self._buffer = None
            # The rest of the body is not read (not drained either): the view answers 413 now.
            raise StopUpload(connection_reset=True)
        # Django sends a file's chunks between new_file (which opens the buffer) and file_complete;
        # after StopUpload it reads no further part.
        assert self._buffer is not None, "a chunk arrived outside a file"
        self._buffer.write(raw_data)
        return None

    def file_complete(self, file_size):
        if self._buffer is None:
            return None
        self._buffer.seek(0)
        return InMemoryUploadedFile(
            file=self._buffer,
            field_name=self.field_name,
            name=self.file_name,
            content_type=self.content_type,
            size=file_size,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )
