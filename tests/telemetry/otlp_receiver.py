"""A local OTLP/HTTP receiver: the collector end of the wire, decoded with the real protobufs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Received:
    spans: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, list[Any]] = field(default_factory=dict)
    resources: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_traces(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for rs in req.resource_spans:
                self.resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            {
                                "name": s.name,
                                "attributes": {a.key: _value(a.value) for a in s.attributes},
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "status": s.status.code,
                            }
                        )

    def add_metrics(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest.FromString(body)
        with self.lock:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        self.metrics.setdefault(m.name, []).append(m)


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Yields (endpoint, received) for a receiver on a free loopback port."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.paths.append(self.path)
            if self.path == "/v1/traces":
                received.add_traces(body)
            elif self.path == "/v1/metrics":
                received.add_metrics(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
