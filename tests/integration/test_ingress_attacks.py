"""Attacks on ``matcher ingress`` as a real process, over raw sockets."""

from __future__ import annotations

import socket

import pytest

from tests.support import webhooks as senders
from tests.support.ingress import host_port
from tests.support.processes import IngressProcess

pytestmark = pytest.mark.timeout(120)


def _exchange(ingress: IngressProcess, request: bytes) -> bytes:
    """Everything the ingress answers on one connection, until it closes or goes quiet."""
    with socket.create_connection(host_port(ingress), timeout=10) as conn:
        conn.sendall(request)
        conn.settimeout(3)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


def test_content_length_with_transfer_encoding_closes_the_connection(
    ingress: IngressProcess,
) -> None:
    """RFC 9112 6.1: a request with both Content-Length and Transfer-Encoding "might
    indicate an attempt to perform request smuggling"; the server MUST close the connection
    after responding (or refuse it). A front proxy that frames by Content-Length would
    otherwise have the ingress read a request the proxy never saw."""
    body = senders.body_bytes(senders.openai_batch("batch_smuggle"))
    head = b"".join(n + b": " + v + b"\r\n" for n, v in senders.standard_request(body, "m_s"))
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    request = (
        b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n" + head
        + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) + smuggled
    )  # fmt: skip
    answer = _exchange(ingress, request)
    assert answer.count(b"HTTP/1.1 ") == 1, answer.decode(errors="replace")


def test_the_host_header_is_not_reflected_into_a_redirect(ingress: IngressProcess) -> None:
    """A trailing slash makes Starlette answer 307 with a Location built from the Host
    header: a sender's header reflected, and a 307 makes clients re-send the signed POST
    body to that host."""
    answer = _exchange(
        ingress,
        b"POST /v1/webhooks/openai/ HTTP/1.1\r\nHost: attacker.example\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    assert b"attacker.example" not in answer, answer.decode(errors="replace")


@pytest.mark.parametrize("pad", [17_000, 60_000])
def test_headers_over_the_bound_are_refused_even_in_one_read(
    ingress: IngressProcess, pad: int
) -> None:
    """h11 bounds headers only while they arrive in pieces; sent in one write, 60 KB of
    headers were parsed and the request handled. MATCHER_MAX_HEADER_BYTES is 16 KiB."""
    body = b"{}"
    answer = _exchange(
        ingress,
        b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Pad: " + b"y" * pad + b"\r\nContent-Length: 2\r\n\r\n" + body,
    )
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200].decode(errors="replace")
    assert b'"too_large"' in answer, answer[:400].decode(errors="replace")
