"""Fair shares between tenants (issue 30): tenant bob's python_exec latency
alone, then while tenant alice sits at every share (jobs, sessions, the warm
pool) and keeps calling for more (each refused). Needs the official MCP
Python SDK (the test venv has it: target/test-env/venv/bin/python).

    target/test-env/venv/bin/python bench/shares.py --bin target/debug/ferrepl
"""
import argparse
import asyncio, os, subprocess, tempfile, time, statistics, socket
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
import httpx2, contextlib
@contextlib.asynccontextmanager
async def connect(url, token):
    async with httpx2.AsyncClient(headers={'Authorization': f'Bearer {token}'}, timeout=120) as hc:
        async with streamable_http_client(url, http_client=hc) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s


A, B = "a"*32, "b"*32
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

async def timed(sess, tool, args):
    t = time.perf_counter(); r = await sess.call_tool(tool, args); return time.perf_counter() - t, r

async def main():
    d = tempfile.mkdtemp(); ws = os.path.join(d, "ws"); os.mkdir(ws)
    tok = os.path.join(d, "tokens"); open(tok, "w").write(f"{A} alice\n{B} bob\n")
    port = free_port()
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(d, "state"))
    p = subprocess.Popen([ARGS.bin, "--http", f"127.0.0.1:{port}", "--auth-token-file", tok,
        "--workdir", ws, "--tools", "all", "--max-jobs", "2", "--max-sessions", "4", "--warm-pool", "2"],
        stderr=open(os.path.join(d, "log"), "w"), env=env)
    url = f"http://127.0.0.1:{port}/mcp"
    for _ in range(200):
        try: socket.create_connection(("127.0.0.1", port)).close(); break
        except OSError: await asyncio.sleep(0.05)
    try:
        async with connect(url, B) as bob:
            await bob.call_tool("python_exec", {"code": "1"})
            base = [ (await timed(bob, "python_exec", {"code": "2+2"}))[0] for _ in range(ARGS.calls) ]
            async with connect(url, A) as alice:
                await alice.call_tool("shell_exec", {"command": "sleep 600", "wait_s": 0})
                await alice.call_tool("python_exec", {"code": "1"})
                await alice.call_tool("python_exec", {"code": "1", "session": "s2"})
                stop = False
                refused = 0
                async def hammer():
                    nonlocal refused
                    i = 0
                    while not stop:
                        i += 1
                        for tool, args in (("shell_exec", {"command": "true", "wait_s": 0}),
                                           ("python_exec", {"code": "1", "session": f"x{i}"}),
                                           ("python_install", {"packages": ["six"], "wait_s": 0})):
                            r = await alice.call_tool(tool, args)
                            refused += bool(r.is_error)
                h = asyncio.create_task(hammer())
                loaded = [ (await timed(bob, "python_exec", {"code": "2+2"}))[0] for _ in range(ARGS.calls) ]
                stop = True; await h
        q = lambda xs: f"median {statistics.median(xs)*1000:.1f} ms, p95 {sorted(xs)[int(len(xs)*.95)]*1000:.1f} ms"
        print("bob alone:          ", q(base))
        print("alice at her shares:", q(loaded), f"(alice refused {refused} calls meanwhile)")
    finally:
        p.terminate(); p.wait()
parser = argparse.ArgumentParser(description="tenant shares: latency of one tenant while another is at its limits")
parser.add_argument("--bin", default="target/debug/ferrepl")
parser.add_argument("--calls", type=int, default=40)
ARGS = parser.parse_args()
asyncio.run(main())
