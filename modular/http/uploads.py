"""The body of ``POST /v1/jobs``: JSON, or a multipart form with the JSON as ``request`` and image files.

Image inputs come as base64 in the JSON's ``images`` table or as files of the form, named by input
(``image``, ``mask_image``, ``control_image``). Each is checked (bytes, then the size its header states,
then that it decodes) and stored under ``uploads/<sha256>.<format>``, a name the server makes: a client's
file name is never used. The body is read up to ``max_body`` bytes and refused (413) past it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
from pathlib import Path
from typing import Any

import PIL.Image
from starlette.requests import Request

from modular.http.settings import ServerSettings
from modular.serving.store import write_result

__all__ = ["UploadError", "read_job_body", "store_image"]

_FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}


class UploadError(ValueError):
    """A body or image the server refuses; ``status`` is the HTTP status (400, 413 or 415)."""

    def __init__(self, message: str, status: int = 400) -> None:
        self.status = status
        super().__init__(message)


async def _limited_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise UploadError(f"the request body is {declared} bytes; this server takes at most {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise UploadError(
                f"the request body is more than {limit} bytes; this server takes at most {limit}", 413
            )
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # Starlette's cache of the body: form() then parses these bytes, read once here
    return body


def store_image(data: bytes, name: str, folder: Path, settings: ServerSettings) -> Path:
    """Check one input image's bytes and store them under a name made from their sha256; returns the path.

    Raises:
        UploadError: too many bytes (413), not a PNG, JPEG or WebP image, or one that does not decode.
    """
    if len(data) > settings.max_upload:
        raise UploadError(
            f"image {name!r} is {len(data)} bytes; this server takes at most {settings.max_upload}", 413
        )
    try:
        with PIL.Image.open(io.BytesIO(data)) as image:
            kind = image.format
            if kind not in _FORMATS:
                raise UploadError(f"image {name!r} is {kind or 'not an image'}; send PNG, JPEG or WebP", 415)
    except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as error:
        if isinstance(error, UploadError):
            raise
        raise UploadError(f"image {name!r} is not an image this server can read ({error})") from None
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest}.{_FORMATS[kind]}"
    if not path.is_file():
        write_result(folder, path.name, data)
    return path


async def read_job_body(
    request: Request, folder: Path, settings: ServerSettings
) -> tuple[Any, dict[str, Path]]:
    """The request's JSON and its stored images, by input name.

    Raises:
        UploadError: a body past ``max_body`` (413), one that is not JSON (or a form with ``request``), or a bad image.
    """
    body = await _limited_body(request, settings.max_body)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    uploads: dict[str, Path] = {}
    if kind == "multipart/form-data":
        try:
            form = await request.form(max_files=16, max_fields=64)
        except Exception as error:  # python-multipart's errors for a malformed form
            raise UploadError(f"the form could not be read ({error})") from None
        text = form.get("request")
        if not isinstance(text, str):
            raise UploadError("a form sends the JSON request as its field 'request' and images as files")
        data = _json(text.encode())
        for key, value in form.multi_items():
            if key == "request":
                continue
            if isinstance(value, str):
                raise UploadError(f"form field {key!r} must be an image file (the JSON goes in 'request')")
            uploads[key] = store_image(await value.read(), key, folder, settings)
    elif kind in ("application/json", ""):
        data = _json(body)
    else:
        raise UploadError(f"send the job as application/json or multipart/form-data (got {kind!r})", 415)
    if isinstance(data, dict) and "images" in data:
        images = data.pop("images")
        if not isinstance(images, dict) or not all(isinstance(value, str) for value in images.values()):
            raise UploadError("'images' must map input names to base64 images, e.g. {'image': 'iVBORw0...'}")
        for key, text in images.items():
            try:
                decoded = base64.b64decode(
                    text.split(",", 1)[-1] if text.startswith("data:") else text, validate=True
                )
            except (binascii.Error, ValueError):
                raise UploadError(f"image {key!r} is not base64") from None
            uploads[key] = store_image(decoded, key, folder, settings)
    return data, uploads


def _not_a_number(name: str) -> Any:
    raise UploadError(f"the request is not JSON ({name} is no JSON number)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity
        raise UploadError(f"the request is not JSON this server takes ({text} is past a 64-bit float)")
    return value


def _json(body: bytes) -> Any:
    # Python's json takes NaN, Infinity, 1e999 and lone surrogates ("\ud800"), which no JSON answer can carry back
    # (GET /v1/jobs shows each job's request): refused here, with the rest that is not JSON.
    try:
        data = json.loads(body, parse_constant=_not_a_number, parse_float=_finite)
    except UploadError:
        raise
    except RecursionError:
        raise UploadError("the request is not JSON this server takes (it nests too deep)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UploadError(f"the request is not JSON ({error})") from None
    except ValueError:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise UploadError("the request is not JSON this server takes (a number of too many digits)") from None
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        bad = error.object[error.start : error.end]
        msg = f"the request is not JSON text (it holds {ascii(bad)}, half of a UTF-16 pair, which is no character)"
        raise UploadError(msg) from None
    return data
