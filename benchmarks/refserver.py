"""The floor: a minimal extender that only parses the request JSON and answers that every node
passes (filter) or scores 0 (prioritize), on one of three stacks (``--server``):

- ``starlette`` (default): Starlette on uvicorn (uvloop, httptools) with orjson, the stack
  gpuplace-extender runs on. Any Python extender on this stack pays at least this much per
  request; ``bench_extender`` prints gpuplace's latency as a ratio to it.
- ``asgi``: a bare ASGI callable on the same uvicorn: the share of the web framework.
- ``protocol``: an ``asyncio.Protocol`` on uvloop that reads ``Content-Length`` bodies and writes
  one response per request, no HTTP server library at all: the share of the server. A
  measuring device only (no chunked bodies, no limits, no error handling): not for production.

``bench_scheduler --floor starlette,asgi,protocol`` puts each under kube-scheduler.
Run: ``python -m benchmarks.refserver --port 8899 [--server asgi]``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

SERVERS = ("starlette", "asgi", "protocol")


def _names(args: dict) -> list[str]:
    if args.get("NodeNames") is not None:
        return list(args["NodeNames"])
    return [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items") or []]


def answer(path: str, body: bytes) -> bytes | None:
    """The floor's answer to ``POST path`` with ``body``; None for an unknown path."""
    if path == "/filter":
        args = orjson.loads(body)
        if args.get("NodeNames") is not None:
            out = {"NodeNames": args["NodeNames"], "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                   "Error": ""}
        else:
            out = {"Nodes": args["Nodes"], "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                   "Error": ""}
        return orjson.dumps(out)
    if path == "/prioritize":
        return orjson.dumps([{"Host": n, "Score": 0} for n in _names(orjson.loads(body))])
    return None


async def filter_(request: Request) -> Response:
    return Response(answer("/filter", await request.body()), media_type="application/json")


async def prioritize(request: Request) -> Response:
    return Response(answer("/prioritize", await request.body()), media_type="application/json")


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/filter", filter_, methods=["POST"]), Route("/prioritize", prioritize, methods=["POST"]),
                        Route("/healthz", healthz, methods=["GET"])])


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor as a bare ASGI application (``--server asgi``)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    out = b"ok" if scope["path"] == "/healthz" else answer(scope["path"], b"".join(chunks))
    status = 200 if out is not None else 404
    out = out if out is not None else b"not found"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


class FloorProtocol(asyncio.Protocol):
    """The floor on a bare ``asyncio.Protocol`` (``--server protocol``): HTTP/1.1 keep-alive with
    ``Content-Length`` bodies, one write per response."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
            out = b"ok" if path == "/healthz" else answer(path, body)
            status = b"200 OK" if out is not None else b"404 Not Found"
            out = out if out is not None else b"not found"
            self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (status, len(out), out))


async def serve_protocol(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(FloorProtocol, host, port)
    await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8899)
    p.add_argument("--server", choices=SERVERS, default="starlette", help="the stack (see above; default starlette)")
    a = p.parse_args()
    if a.server == "protocol":
        import uvloop

        uvloop.run(serve_protocol(a.host, a.port))
        return
    # Same server settings as gpuplace-extender (scheduler_extender/cli.py).
    uvicorn.run(app if a.server == "starlette" else asgi_app, host=a.host, port=a.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
