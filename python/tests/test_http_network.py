"""``http/request`` made by the server, and a managed network proxy whose
open questions a Python coroutine answers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List

import pytest

from exec_server import Command, Environment, NetworkRequest, managed_network

from .conftest import Server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                piece = b"piece %d;" % i
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        body = b"hello " + self.path.encode()
        self.send_response(200)
        self.send_header("X-Test", "yes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[::-1])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_http_request_whole_and_streamed(web: str) -> None:
    async with Environment.local() as env:
        r = await env.http_request("GET", f"{web}/x", headers={"Accept": "text/plain"})
        assert (r.status, r.body) == (200, b"hello /x")
        assert ("x-test", "yes") in [(k.lower(), v) for k, v in r.headers]
        r = await env.http_request("POST", f"{web}/p", body=b"abc")
        assert (r.status, r.body) == (201, b"cba")
        s = await env.http_stream("GET", f"{web}/stream")
        assert s.status == 200
        assert b"".join([c async for c in s.body]) == b"".join(b"piece %d;" % i for i in range(5))


async def test_a_python_policy_decides_what_the_proxy_asks(server: Server) -> None:
    asked: List[NetworkRequest] = []

    async def decide(request: NetworkRequest) -> bool:
        asked.append(request)
        return request.host == "allowed.invalid"

    # Names that never resolve: nothing leaves this host. The proxy asks
    # about each (its rules leave them open); a denied one gets 403 from
    # the proxy, an allowed one gets as far as the failed lookup (502).
    script = (
        "for h in allowed.invalid denied.invalid; do "
        "curl -s -o /dev/null -w \"$h=%{http_code} \" --max-time 20 http://$h/; done"
    )
    async with Environment.connect(server.url, network_policy=decide) as env:
        cmd = Command(["sh", "-c", script]).network_proxy(managed_network(ask_timeout=10))
        done = await env.run(cmd)
    assert done.stdout.decode().split() == ["allowed.invalid=502", "denied.invalid=403"], done
    assert sorted(r.host for r in asked) == ["allowed.invalid", "denied.invalid"]
    assert all(r.process_id for r in asked)


async def test_a_plain_function_policy_and_a_failing_one(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    def allow_all(request: NetworkRequest) -> bool:
        return True

    async def broken(request: NetworkRequest) -> bool:
        raise RuntimeError("bug in the policy")

    script = "curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://some.invalid/"
    cmd = Command(["sh", "-c", script]).network_proxy(managed_network(ask_timeout=10))
    async with Environment.connect(server.url, network_policy=allow_all) as env:
        assert (await env.run(cmd)).stdout == b"502"
    with caplog.at_level("WARNING", logger="exec_server"):
        async with Environment.connect(server.url, network_policy=broken) as env:
            assert (await env.run(cmd)).stdout == b"403"
    assert "network policy failed" in caplog.text
