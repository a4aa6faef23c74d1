"""A minimal HTTP/1.1 client on asyncio streams: one keep-alive connection, JSON in and out.

The fleet bench gives each of thousands of simulated workers one of these. An httpx client shared by
them all looks through its whole connection pool at every request, which at thousands of
connections costs the bench more CPU per pop than the server spends; one connection per worker, with
no pool, keeps the load generator light.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class RawConnection:
    """One connection to `host:port`, opened on first use and again after the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.reader.at_eof():
            self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None). A connection the server closed while idle is
        reopened and the call sent once more: the server had not read it."""
        payload = b"" if body is None else _encode(body)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 f"Content-Length: {len(payload)}"]  # fmt: skip
        if body is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        message = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
        for attempt in (1, 2):
            reader, writer = await self._open()
            try:
                writer.write(message)
                await writer.drain()
                status_line = await reader.readline()
                if not status_line:
                    raise ConnectionResetError("the server closed the connection")
            except ConnectionError:
                self.close()
                if attempt == 1:
                    continue
                raise
            return await self._response(status_line, reader)
        raise AssertionError("unreachable")

    async def _response(self, status_line: bytes, reader: asyncio.StreamReader) -> tuple[int, Any]:
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
            elif name == "transfer-encoding":
                raise ValueError("chunked answers are not read here")
        data = await reader.readexactly(length) if length else b""
        if close:
            self.close()
        try:
            return status, _decode(data) if data else None
        except msgspec.DecodeError:
            return status, None
