"""Threads of the Prometheus endpoint under N idle connections: ddpdoctor's selector server (live/metrics_http.py)
against prometheus_client's start_http_server (a thread per connection), measured in the same run.

    .venv/bin/python benchmarks/metrics_connections.py [N]      (default 1000)"""

from __future__ import annotations

import resource
import socket
import sys
import threading
import time


def idle_threads(port: int, n: int) -> int:
    before = threading.active_count()
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    time.sleep(2.0)
    peak = threading.active_count()
    for s in held:
        s.close()
    return peak - before


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * n + 256)), hard))
    from prometheus_client import CollectorRegistry, start_http_server

    from ddpdoctor.live.export import PrometheusExporter

    ours = PrometheusExporter("127.0.0.1", 0)
    t0 = threading.active_count()
    ours_extra = idle_threads(ours.port, n)
    ours.close()
    started = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    server = started[0] if isinstance(started, tuple) else None
    port = server.server_port if server is not None else 0
    theirs_extra = idle_threads(port, n)
    print(f"{n} idle connections: ddpdoctor's endpoint +{ours_extra} threads (process had {t0}); "
          f"prometheus_client's start_http_server +{theirs_extra} threads")


if __name__ == "__main__":
    main()
