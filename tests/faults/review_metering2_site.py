"""Views for the second review of metered usage on real servers: a proxied download (a file whose size is
unknown before it is read), a large file and a slow async stream, which a client may leave midway."""

from __future__ import annotations

import asyncio
import io
import os

from django.http import FileResponse, StreamingHttpResponse
from django.urls import path

CHUNK = b"x" * 1000


class Upstream:
    """A file read as it comes, as a proxied download is: no size, no seek."""

    def __init__(self, size: int) -> None:
        self.data = io.BytesIO(b"x" * size)

    def read(self, size: int = -1) -> bytes:
        return self.data.read(size)

    def close(self) -> None:
        self.data.close()


def proxied(request):
    return FileResponse(Upstream(int(request.GET["size"])))


def local_file(request):
    return FileResponse(open(os.environ["REVIEW_METERING_FILE"], "rb"))  # noqa: SIM115 - the response closes it


async def slow_stream(request):
    async def chunks():
        for _ in range(int(request.GET["chunks"])):
            yield CHUNK
            await asyncio.sleep(0.05)
    return StreamingHttpResponse(chunks())


urlpatterns = [
    path("download/proxied/", proxied, name="download"),
    path("download/file/", local_file, name="download"),
    path("download/slow/", slow_stream, name="download"),
]
