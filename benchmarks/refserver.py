"""The floor: a minimal extender on the same stack (Starlette + uvicorn + orjson) that only parses
the request JSON and answers that every node passes (filter) or scores 0 (prioritize).

Any Python extender pays at least this much per request; ``bench_extender`` prints gpuplace's
latency as a ratio to it. Run: ``python -m benchmarks.refserver --port 8899``.
"""

from __future__ import annotations

import argparse

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


def _names(args: dict) -> list[str]:
    if args.get("NodeNames") is not None:
        return list(args["NodeNames"])
    return [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items") or []]


async def filter_(request: Request) -> Response:
    args = orjson.loads(await request.body())
    if args.get("NodeNames") is not None:
        out = {"NodeNames": args["NodeNames"], "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
               "Error": ""}
    else:
        out = {"Nodes": args["Nodes"], "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
               "Error": ""}
    return Response(orjson.dumps(out), media_type="application/json")


async def prioritize(request: Request) -> Response:
    args = orjson.loads(await request.body())
    return Response(orjson.dumps([{"Host": n, "Score": 0} for n in _names(args)]), media_type="application/json")


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/filter", filter_, methods=["POST"]), Route("/prioritize", prioritize, methods=["POST"]),
                        Route("/healthz", healthz, methods=["GET"])])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8899)
    a = p.parse_args()
    # Same server settings as gpuplace-extender (scheduler_extender/cli.py).
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
