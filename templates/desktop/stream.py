"""The desktop's live view: noVNC's page and its WebSocket, behind a per-stream secret.

Everything a browser fetches lives under ``/<secret>/`` (``/<secret>/vnc.html``, its
scripts, and the WebSocket at ``/<secret>/websockify``); any other path is answered 403
before a byte of the desktop is served. The WebSocket is bridged to x11vnc's Unix socket,
so the VNC server itself has no TCP port that a sandbox URL could reach. Standard library
only: the guest's Python, no packages.
"""

import argparse
import asyncio
import base64
import hashlib
import hmac
import mimetypes
import os
import sys
import urllib.parse
from pathlib import Path

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HEAD = 16 * 1024
MAX_FRAME = 1 << 20


def respond(writer, status, reason, body=b"", headers=()):
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


def unmask(data, mask):
    n = len(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def frame(opcode, payload):
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, "big")
    return head + payload


class LiveView:
    def __init__(self, secret, web, vnc):
        self.secret = secret
        self.web = web.resolve()
        self.vnc = vnc

    async def handle(self, reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        try:
            await self.answer(head, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def answer(self, head, reader, writer):
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            respond(writer, 400, "Bad Request")
            return
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        path = urllib.parse.unquote(target.split("?", 1)[0])
        segments = path.split("/", 2)
        given = segments[1] if len(segments) > 1 else ""
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            respond(writer, 403, "Forbidden", b"this live view needs its stream secret in the URL\n",
                    [("Content-Type", "text/plain")])
            return
        rest = segments[2] if len(segments) > 2 else ""
        if headers.get("upgrade", "").lower() == "websocket":
            await self.websocket(headers, reader, writer)
        elif method in ("GET", "HEAD"):
            self.static(method, rest or "vnc.html", writer)
        else:
            respond(writer, 405, "Method Not Allowed")
        await writer.drain()

    def static(self, method, rest, writer):
        file = (self.web / rest).resolve()
        if not file.is_relative_to(self.web) or not file.is_file():
            respond(writer, 404, "Not Found")
            return
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if file.suffix == ".js":
            kind = "text/javascript"
        body = file.read_bytes()
        respond(writer, 200, "OK", b"" if method == "HEAD" else body,
                [("Content-Type", kind), ("Cache-Control", "no-store")])

    async def websocket(self, headers, reader, writer):
        key = headers.get("sec-websocket-key", "")
        if not key:
            respond(writer, 400, "Bad Request")
            return
        try:
            vnc_reader, vnc_writer = await asyncio.open_unix_connection(self.vnc)
        except OSError:
            respond(writer, 503, "Service Unavailable", b"the desktop's VNC server is not running\n")
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()
        lines = ["HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Accept: {accept}"]
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        if "binary" in offered:
            lines.append("Sec-WebSocket-Protocol: binary")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        to_vnc = asyncio.ensure_future(self.client_to_vnc(reader, writer, vnc_writer))
        to_client = asyncio.ensure_future(self.vnc_to_client(vnc_reader, writer))
        await asyncio.wait([to_vnc, to_client], return_when=asyncio.FIRST_COMPLETED)
        for task in (to_vnc, to_client):
            task.cancel()
        vnc_writer.close()

    async def client_to_vnc(self, reader, writer, vnc_writer):
        while True:
            b0, b1 = await reader.readexactly(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = int.from_bytes(await reader.readexactly(2), "big")
            elif n == 127:
                n = int.from_bytes(await reader.readexactly(8), "big")
            if n > MAX_FRAME:
                return
            mask = await reader.readexactly(4) if b1 & 0x80 else b""
            payload = await reader.readexactly(n)
            if mask:
                payload = unmask(payload, mask)
            if opcode == 0x8:
                writer.write(frame(0x8, payload[:2]))
                await writer.drain()
                return
            if opcode == 0x9:
                writer.write(frame(0xA, payload))
                await writer.drain()
            elif opcode in (0x0, 0x1, 0x2):
                vnc_writer.write(payload)
                await vnc_writer.drain()

    async def vnc_to_client(self, vnc_reader, writer):
        while True:
            data = await vnc_reader.read(65536)
            if not data:
                writer.write(frame(0x8, (1000).to_bytes(2, "big")))
                await writer.drain()
                return
            writer.write(frame(0x2, data))
            await writer.drain()


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--vnc", required=True, help="x11vnc's Unix socket")
    parser.add_argument("--web", type=Path, required=True, help="noVNC's files")
    parser.add_argument("--ready", type=Path, required=True, help="created once listening")
    args = parser.parse_args()
    secret = args.secret_file.read_text().strip()
    if len(secret) < 16:
        sys.exit("the stream secret is too short")
    view = LiveView(secret, args.web, args.vnc)
    server = await asyncio.start_server(view.handle, "127.0.0.1", args.port, limit=MAX_HEAD)
    args.ready.touch()
    os.chmod(args.ready, 0o600)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
