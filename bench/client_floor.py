"""The CPU a worker spends in its clients alone, per call: the floor under bench/latency.py's CPU per step.

Starts ``bench/fake_model_server.py`` with no latency, then, in this one
process, makes ``--calls`` calls of each kind, ``--concurrency`` at a time
on one event loop, and prints the client's CPU per call
(``time.process_time``; the server runs in a process of its own):

* a chat completion through the OpenAI SDK (``openai.AsyncOpenAI``), as
  the LangGraph side of bench/latency.py makes it (its typed
  ``chat.completions.create`` over httpx): streamed (the default) and not;
* the same request as Tollgate's ``openai`` provider makes it: the SDK's
  ``client.post`` with a plain JSON body, the answer read as decoded JSON,
  over the SDK's aiohttp transport (``runs.providers.sdk_calls``);
* a GET through an ``aiohttp`` session, as the demo's tools ask the
  payment gateway, and the same through ``httpx.AsyncClient`` (what they
  used before: about ten times the CPU).

bench/latency.py's run is 3 model calls and 2 tool calls (3 gateway
requests); what these clients cost per step is CPU no engine can save
while it uses these libraries the way it does, on either side of the
comparison (both figures are printed).

Example: ``.venv/bin/python bench/client_floor.py --calls 400``.
"""

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "system", "content": "Look the order up, refund what the requester asks, then say what you did."},
            {"role": "user", "content": "refund order 1000001"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "query_order", "arguments": '{"order_id": 1000001}'}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": '{"order_id": 1000001, "total": "120.00", "status": "paid", "refundable_amount": "120.00"}'}]
# The history of a run's second model call (of three): the SDK's typed layer walks all of it for every request.
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {name} tool.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}}
    for name in ("query_order", "refund")]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls of each kind (default 400)")
    parser.add_argument("--concurrency", type=int, default=50, help="calls in flight at once (default 50)")
    parser.add_argument("--port", type=int, default=8797, help="the fake model server's port (default 8797)")
    return parser.parse_args()


async def cpu_per_call(call, calls: int, concurrency: int) -> float:
    """CPU milliseconds of this process per ``await call()``, after one warm-up round."""
    await asyncio.gather(*[call() for _ in range(concurrency)])
    started = time.process_time()
    for _ in range(max(1, calls // concurrency)):
        await asyncio.gather(*[call() for _ in range(concurrency)])
    return (time.process_time() - started) * 1000 / (max(1, calls // concurrency) * concurrency)


async def measure(args) -> dict[str, float]:
    base = f"http://127.0.0.1:{args.port}"
    model = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    raw = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                             http_client=openai.DefaultAioHttpClient())
    body = {"model": "m", "messages": MESSAGES, "tools": TOOLS}
    plain = httpx.AsyncClient(base_url=base)
    session = aiohttp.ClientSession(base_url=base)

    async def streamed():
        async for chunk in await model.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True):
            for choice in chunk.choices:
                choice.delta.tool_calls  # noqa: B018 (read, as a consumer does)

    async def whole():
        (await model.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)).choices[0].message

    async def raw_streamed():
        stream = await raw.post("/chat/completions", body={**body, "stream": True}, cast_to=object, stream=True,
                                stream_cls=openai.AsyncStream[object])
        async with stream:
            async for chunk in stream:
                for choice in chunk.get("choices") or ():
                    choice["delta"].get("tool_calls")

    async def raw_whole():
        (await raw.post("/chat/completions", body=body, cast_to=object))["choices"][0]["message"]

    async def get():
        (await plain.get("/health")).raise_for_status()

    async def aiohttp_get():
        async with session.get("/health") as response:
            response.raise_for_status()
            await response.read()

    figures = {}
    for name, call in (("OpenAI SDK chat completion, streamed", streamed),
                       ("OpenAI SDK chat completion, not streamed", whole),
                       ("OpenAI SDK post as Tollgate sends it, streamed", raw_streamed),
                       ("OpenAI SDK post as Tollgate sends it, not streamed", raw_whole),
                       ("aiohttp GET", aiohttp_get),
                       ("httpx.AsyncClient GET", get)):
        figures[name] = await cpu_per_call(call, args.calls, args.concurrency)
    await plain.aclose()
    await session.close()
    await model.close()
    await raw.close()
    return figures


def main() -> int:
    args = parse_args()
    server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_model_server.py"), "--port", str(args.port),
                               "--latency", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{args.port}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    print("the fake model server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        figures = asyncio.run(measure(args))
    finally:
        server.terminate()
        server.wait(10)
    print(f"client CPU per call ({args.calls} calls, {args.concurrency} at a time):")
    for name, ms in figures.items():
        print(f"  {name}: {ms:.2f} ms")
    model_calls, gateway_calls, steps = 3, 3, 5  # bench/latency.py's run
    for side, name in (("Tollgate", "OpenAI SDK post as Tollgate sends it, streamed"),
                       ("the LangGraph side", "OpenAI SDK chat completion, streamed")):
        floor = (model_calls * figures[name] + gateway_calls * figures["aiohttp GET"]) / steps
        print(f"per step of bench/latency.py's run (3 streamed model calls, 3 gateway requests, 5 steps), "
              f"{side}: {floor:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
