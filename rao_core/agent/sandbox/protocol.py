"""Length-prefixed JSON frames between the orchestrator and a REPL worker.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object).
JSON only, never pickle: the worker runs model-written code, so everything it sends is untrusted
and must be cheap to reject. A frame over MAX_FRAME, a body that is not a JSON object, or a
stream that ends mid-frame is a protocol violation; the orchestrator then kills the worker.

worker.py runs as a standalone script and cannot import this module; it carries a copy of
MAX_FRAME, encode() and FrameDecoder. Keep the two copies identical.
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAX_FRAME = 16 * 2**20
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    pass


def encode(msg: dict) -> bytes:
    body = json.dumps(msg, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME} byte limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed() bytes as they arrive, get back the complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        frames = []
        while len(self._buf) >= 4:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ProtocolError(f"oversized frame ({n} bytes)")
            if len(self._buf) < 4 + n:
                break
            body = bytes(self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
            try:
                msg = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise ProtocolError(f"malformed frame ({type(e).__name__})") from None
            if not isinstance(msg, dict):
                raise ProtocolError("malformed frame (not an object)")
            frames.append(msg)
        return frames
