"""A small PyTorch inference server for gpushare-bench's "bring your own workload".

It stands for a typical eager PyTorch service: transformers' YOLOS in the yolos-small
shape with random weights (model.py), batch 1, one forward pass per inference. It
exports the latency of every inference as the Prometheus histogram
`inference_time_seconds` with gpushare-workload's buckets (2^(k/32) s from 2^-17 s to
2^6 s, the bounds of a native histogram of schema 5), so the harness reads both the
same way, at the same resolution (a quantile inside its bucket is off by at most 2.2%).

Endpoints on --port:
  GET  /metrics  the Prometheus text (prometheus_client)
  GET  /healthz  200 once the model is built and warmed up, 503 before
  POST /infer    (--mode requests only; GET too) runs one inference; a body is read and
                 ignored (the input is the random image built at start); answers JSON
                 {"latency_s": ...}

Modes:
  loop      (default) the server makes its own load: inferences back to back, as
            gpushare-workload does in its closed loop
  requests  it waits for requests; they queue (first come, first served) for one
            worker, the main thread that built and warmed the model, which runs
            every inference. Each connection's thread only waits for its answer:
            PyTorch sets up CUDA state (a cuBLAS handle, its workspace) per thread,
            so an inference on a new thread is several times slower, and under an
            open load every new connection is a new thread (measured on an H100
            at 40 requests/s: the first 63 inferences 42 ms each, later ones 7.5
            ms; results/20261123-h100-pytorch-threads at commit 6358458)

Its labels `pod` and `strategy` come from POD and STRATEGY, which gpushare-bench sets
for every pod it starts (else the host name and "none").

    python3 server.py --port 9100 --precision bf16
    gpushare-bench sweep --workload-cmd 'python3 server.py --port {port} --precision bf16'
"""

import argparse
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BUCKETS_PER_DOUBLING = 32
MIN_BUCKET_EXP2 = -17
MAX_BUCKET_EXP2 = 6


def latency_buckets():
    """gpushare-workload's bucket bounds (workload/src/metrics.rs): 737 before +Inf."""
    lo, hi = MIN_BUCKET_EXP2 * BUCKETS_PER_DOUBLING, MAX_BUCKET_EXP2 * BUCKETS_PER_DOUBLING
    return [2.0 ** (k / BUCKETS_PER_DOUBLING) for k in range(lo, hi + 1)]


class Metrics:
    """The server's series, each with the labels pod and strategy."""

    def __init__(self, metric: str, pod: str, strategy: str, info: dict):
        self.registry = CollectorRegistry()
        labels = ["pod", "strategy"]
        self.latency = Histogram(
            metric,
            "Seconds per inference (forward pass and copy of the result to the host).",
            labels,
            buckets=latency_buckets(),
            registry=self.registry,
        ).labels(pod, strategy)
        self.errors = Counter(
            "inference_errors",
            "Inferences that failed, by kind.",
            labels + ["kind"],
            registry=self.registry,
        )
        self.ready = Gauge("workload_ready", "1 once warmed up.", labels, registry=self.registry).labels(pod, strategy)
        info_gauge = Gauge(
            "workload_info",
            "What this server runs (value 1).",
            labels + sorted(info),
            registry=self.registry,
        )
        info_gauge.labels(pod, strategy, *[info[k] for k in sorted(info)]).set(1)
        self.pod, self.strategy = pod, strategy

    def failed(self, kind: str) -> None:
        self.errors.labels(self.pod, self.strategy, kind).inc()


class Job:
    """One request's inference, waiting in the queue; the worker fills it in."""

    def __init__(self):
        self.done = threading.Event()
        self.took = None
        self.error = None


class Server:
    """The model, the queue of requests for its one worker, and the readiness flag."""

    def __init__(self, model, pixels, metrics: Metrics, infer):
        self.model, self.pixels, self.metrics, self._infer = model, pixels, metrics, infer
        self.jobs = queue.Queue()
        self.is_ready = threading.Event()

    def infer_once(self) -> float:
        """One inference on the calling thread (the worker's: see the module's text)."""
        start = time.perf_counter()
        self._infer(self.model, self.pixels)
        took = time.perf_counter() - start
        self.metrics.latency.observe(took)
        return took

    def submit(self) -> float:
        """Called by a connection's thread: queues an inference, waits for it."""
        job = Job()
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.took

    def work(self, stop: threading.Event) -> None:
        """The worker: runs queued inferences in order until `stop`."""
        while not stop.is_set():
            try:
                job = self.jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                job.took = self.infer_once()
            except Exception as e:  # handed to the request's thread, which answers 500
                job.error = e
            finally:
                job.done.set()


class Listener(ThreadingHTTPServer):
    """socketserver listens with a backlog of 5: under an open load, connections beyond
    it are dropped at SYN and retried after 1, 3, 7, 15 s, which shows up as seconds of
    latency that are the kernel's, not the model's."""

    request_queue_size = 1024
    daemon_threads = True


def handler_for(server: Server, mode: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm
        # holds the body until the client's delayed ACK, ~40 ms per request.
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):  # the access log would flood the pod's log
            pass

        def reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/infer":
                self.do_POST()
            elif path == "/metrics":
                self.reply(200, generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                if server.is_ready.is_set():
                    self.reply(200, b"ok\n")
                else:
                    self.reply(503, b"warming up\n")
            else:
                self.reply(404, b"GET /metrics, /healthz or /infer\n")

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if path != "/infer":
                self.reply(404, b"POST or GET /infer\n")
            elif mode != "requests":
                self.reply(409, b"this server makes its own load (--mode loop); start it with --mode requests\n")
            elif not server.is_ready.is_set():
                self.reply(503, b"warming up\n")
            else:
                try:
                    took = server.submit()
                except Exception as e:  # the GPU's error reaches the client, counted
                    server.metrics.failed(type(e).__name__)
                    self.reply(500, f"{type(e).__name__}: {e}\n".encode())
                    return
                self.reply(200, json.dumps({"latency_s": took}).encode(), "application/json")

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "9100")), help="HTTP port (default $PORT, else 9100)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    p.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--mode", default="loop", choices=["loop", "requests"])
    p.add_argument("--warmup", type=int, default=20, help="inferences before /healthz answers 200 (default 20)")
    p.add_argument("--metric", default="inference_time_seconds", help="the histogram's name")
    a = p.parse_args()

    # Imported here so --help works without torch.
    import torch
    import transformers

    from model import build, infer

    pod = os.environ.get("POD") or socket.gethostname()
    strategy = os.environ.get("STRATEGY") or "none"
    # The port opens once the model is built; until then the harness sees it refused.
    model, pixels, config = build(a.precision, a.device)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device
    info = {
        "model": "yolos-small-pytorch",
        "precision": a.precision,
        "device_name": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": str(getattr(config, "_attn_implementation", "?")),
        "mode": a.mode,
    }
    metrics = Metrics(a.metric, pod, strategy, info)
    server = Server(model, pixels, metrics, infer)
    httpd = Listener((a.host, a.port), handler_for(server, a.mode))
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    for _ in range(a.warmup):
        infer(model, pixels)
    server.is_ready.set()
    metrics.ready.set(1)
    print(
        f"{pod}: yolos-small {a.precision} on {name}, torch {torch.__version__}, mode {a.mode}, "
        f"listening on {a.host}:{a.port}",
        flush=True,
    )
    if a.mode == "loop":
        while not stop.is_set():
            try:
                server.infer_once()
            except Exception as e:
                metrics.failed(type(e).__name__)
                print(f"{pod}: inference failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return 5
    else:
        # The main thread, which built and warmed the model, runs every inference.
        server.work(stop)
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
