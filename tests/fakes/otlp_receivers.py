"""OTLP receivers for tests: real protocol peers on loopback.

`GrpcReceiver` implements ``opentelemetry.proto.collector.metrics.v1.MetricsService``
and ``...logs.v1.LogsService`` on a grpcio server (optionally with TLS); `HttpReceiver`
is an aiohttp server that decodes ``ExportMetricsServiceRequest`` protobuf bodies at
``/v1/metrics`` and ``ExportLogsServiceRequest`` at ``/v1/logs``. Both record every
request with its headers (log records apart, in ``logs``) and can be stopped and
restarted on the same port.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from aiohttp import web
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2


@dataclass
class Received:
    """One export request as the receiver saw it."""

    at: float
    headers: dict[str, str]
    request: metrics_service_pb2.ExportMetricsServiceRequest
    points: list[dict] = field(default_factory=list)


def flatten(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[dict]:
    """One dict per data point: name, unit, kind, temporality, monotonic, attributes, value, times."""
    out = []
    for rm in request.resource_metrics:
        resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                for dp in data.data_points:
                    value = None
                    if kind in ("gauge", "sum"):
                        value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    out.append({
                        "name": metric.name, "unit": metric.unit, "kind": kind,
                        "temporality": getattr(data, "aggregation_temporality", None),
                        "monotonic": getattr(data, "is_monotonic", None),
                        "attributes": {kv.key: kv.value.string_value for kv in dp.attributes},
                        "value": value, "start": dp.start_time_unix_nano, "time": dp.time_unix_nano,
                        "resource": resource, "scope": sm.scope.name,
                    })
    return out


def _any_value(value: common_pb2.AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def flatten_logs(request: logs_service_pb2.ExportLogsServiceRequest) -> list[dict]:
    """One dict per log record: body, severity, event name, attributes, time, resource, scope."""
    out = []
    for rl in request.resource_logs:
        resource = {kv.key: _any_value(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for record in sl.log_records:
                out.append({
                    "body": _any_value(record.body), "severity_number": record.severity_number,
                    "severity_text": record.severity_text, "event_name": record.event_name,
                    "attributes": {kv.key: _any_value(kv.value) for kv in record.attributes},
                    "time": record.time_unix_nano, "resource": resource, "scope": sl.scope.name,
                })
    return out


class _Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Received] = []
        self.logs: list[dict] = []

    def record_logs(self, request: logs_service_pb2.ExportLogsServiceRequest) -> None:
        with self.lock:
            self.logs.extend(flatten_logs(request))

    def wait_for_logs(self, count: int, timeout: float = 60.0) -> list[dict]:
        """Wait until at least ``count`` log records arrived; return them all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.logs) >= count:
                    return list(self.logs)
            time.sleep(0.05)
        raise AssertionError(f"expected {count} OTLP log records within {timeout}s, got {len(self.logs)}")

    def record(self, headers: dict[str, str], request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        entry = Received(time.monotonic(), headers, request, flatten(request))
        with self.lock:
            self.requests.append(entry)

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.logs.clear()

    def wait_for(self, count: int, timeout: float = 60.0) -> list[Received]:
        """Wait until at least ``count`` requests arrived; return them all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.snapshot()
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"expected {count} OTLP requests within {timeout}s, got {len(self.snapshot())}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, recorder: _Recorder):
        self.recorder = recorder

    def Export(self, request, context):
        self.recorder.record({k: v for k, v in context.invocation_metadata()}, request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, recorder: _Recorder):
        self.recorder = recorder

    def Export(self, request, context):
        self.recorder.record_logs(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class GrpcReceiver(_Recorder):
    """An OTLP/gRPC metrics receiver on 127.0.0.1.

    Args:
        port: port to bind (0: pick a free one, kept across restarts).
        tls: (certificate PEM, private key PEM) to serve TLS, or None for plaintext.
    """

    def __init__(self, port: int = 0, tls: tuple[bytes, bytes] | None = None):
        super().__init__()
        self.port = port or free_port()
        self.tls = tls
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> GrpcReceiver:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsServicer(self), server)
        address = f"127.0.0.1:{self.port}"
        if self.tls:
            creds = grpc.ssl_server_credentials([(self.tls[1], self.tls[0])])
            bound = server.add_secure_port(address, creds)
        else:
            bound = server.add_insecure_port(address)
        assert bound == self.port, f"could not bind {address}"
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class HttpReceiver(_Recorder):
    """An OTLP/HTTP (protobuf) metrics receiver on 127.0.0.1 at ``/v1/metrics``."""

    def __init__(self, port: int = 0):
        super().__init__()
        self.port = port or free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _export(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text="want application/x-protobuf")
        message = metrics_service_pb2.ExportMetricsServiceRequest()
        message.ParseFromString(await request.read())
        self.record({k.lower(): v for k, v in request.headers.items()}, message)
        body = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def _export_logs(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text="want application/x-protobuf")
        message = logs_service_pb2.ExportLogsServiceRequest()
        message.ParseFromString(await request.read())
        self.record_logs(message)
        body = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def start(self) -> HttpReceiver:
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        async def setup() -> None:
            app = web.Application()
            app.router.add_post("/v1/metrics", self._export)
            app.router.add_post("/v1/logs", self._export_logs)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(setup())
            ready.set()
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(60), "HTTP receiver did not start"
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        loop, runner = self._loop, self._runner
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(30)
        loop.close()
        self._loop = self._thread = self._runner = None
