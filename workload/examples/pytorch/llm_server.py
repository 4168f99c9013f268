"""An OpenAI-compatible streaming LLM server in PyTorch, for gpushare-bench's "bring your
own workload" with language models.

It stands for a plain PyTorch text-generation service: transformers' LlamaForCausalLM
in a Llama-style shape with random weights (llm_model.py: about 1.1 B parameters by
default), batch 1, greedy decoding against a KV cache, requests served one at a time in
arrival order (a request waits while another generates, which counts in its time to
first token). Point gpushare-bench's streaming client at it:

    gpushare-bench capacity \\
      --workload-cmd 'python3 workload/examples/pytorch/llm_server.py --port {port}' \\
      --request 'http://127.0.0.1:{port}/v1/completions' --stream completions \\
      --prompt-tokens 128 --output-tokens 32 --load poisson:1 \\
      --slo ttft:p90=500ms,itl:p90=50ms

Endpoints on --port:
  GET  /healthz               200 once the model is built and warmed up, 503 before
  POST /v1/completions        "prompt" as token ids (or text), "max_tokens", "stream": true
  POST /v1/chat/completions   "messages" (the last one's text is the prompt)
Answers stream as server-sent events the way vLLM's do: one event per token
(`choices[0].text`, or `choices[0].delta.content` after a role-only first event for
chat), a usage event with stream_options.include_usage, then `data: [DONE]`. There is
no tokenizer: text becomes one token per word (its hash), and a token's text is " t<id>".
Every answer has max_tokens tokens (random weights have no meaningful end of sequence,
so ignore_eos is what it does anyway). A request without "stream": true gets 400.

    python3 llm_server.py --port 9100 --shape 1b --precision bf16
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
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def word_ids(text: str, vocab: int) -> list:
    """One token per word: its CRC-32 within the vocabulary."""
    return [zlib.crc32(w.encode()) % vocab for w in text.split()]


class Job:
    """One request waiting for the worker: its prompt, and the tokens as they come."""

    def __init__(self, prompt: list, max_tokens: int):
        self.prompt, self.max_tokens = prompt, max_tokens
        self.tokens = queue.Queue()  # ids, then None at the end, or an exception
        # Set when the client went away: the worker stops generating for it.
        self.cancelled = threading.Event()


class Server:
    """The model and the queue of requests for its one worker (the main thread, which
    built it: PyTorch sets up CUDA state per thread)."""

    def __init__(self, generate):
        self.generate = generate
        self.jobs = queue.Queue()
        self.is_ready = threading.Event()

    def work(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                job = self.jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            if job.cancelled.is_set():
                continue
            try:
                for token in self.generate(job.prompt, job.max_tokens):
                    if job.cancelled.is_set():
                        break
                    job.tokens.put(token)
                job.tokens.put(None)
            except Exception as e:  # handed to the request's thread, which streams it
                job.tokens.put(e)


class Listener(ThreadingHTTPServer):
    """A deep accept queue, so an open load is not dropped at SYN (see server.py)."""

    request_queue_size = 1024
    daemon_threads = True


def handler_for(server: Server, max_len: int, vocab: int):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Each event leaves when written, not after the client's delayed ACK.
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):
            pass

        def reply(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        def event(self, payload) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            self.chunk(b"data: " + text.encode() + b"\n\n")

        def do_GET(self):
            if self.path.split("?", 1)[0] != "/healthz":
                return self.reply(404, "GET /healthz; POST /v1/completions or /v1/chat/completions\n")
            if server.is_ready.is_set():
                self.reply(200, "ok\n")
            else:
                self.reply(503, "warming up\n")

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as e:
                return self.reply(400, f"the body is not JSON: {e}\n")
            chat = path == "/v1/chat/completions"
            if path not in ("/v1/completions", "/v1/chat/completions"):
                return self.reply(404, "POST /v1/completions or /v1/chat/completions\n")
            if not server.is_ready.is_set():
                return self.reply(503, "warming up\n")
            if req.get("stream") is not True:
                return self.reply(400, 'this server streams: send "stream": true\n')
            try:
                if chat:
                    prompt = word_ids(str(req["messages"][-1]["content"]), vocab)
                else:
                    p = req["prompt"]
                    prompt = [int(t) % vocab for t in p] if isinstance(p, list) else word_ids(str(p), vocab)
                max_tokens = int(req.get("max_tokens", 16))
            except (KeyError, IndexError, TypeError, ValueError) as e:
                return self.reply(400, f"bad request: {type(e).__name__}: {e}\n")
            if not prompt or max_tokens < 1 or len(prompt) + max_tokens > max_len:
                return self.reply(400, f"the prompt and max_tokens must fit 1 to {max_len} tokens\n")
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            job = Job(prompt, max_tokens)
            server.jobs.put(job)
            try:
                self.stream(job, chat, usage)
            except (BrokenPipeError, ConnectionResetError):
                # The client went away (a benchmark ends its cell mid-answer): nothing to
                # answer, nothing more to generate.
                job.cancelled.set()
                self.close_connection = True

        def stream(self, job: Job, chat: bool, usage: bool) -> None:
            prompt, max_tokens = job.prompt, job.max_tokens
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            made = 0
            while True:
                token = job.tokens.get()
                if token is None:
                    break
                if isinstance(token, Exception):
                    self.event({"error": {"message": f"{type(token).__name__}: {token}"}})
                    break
                made += 1
                if chat:
                    if made == 1:
                        self.event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
                    choice = {"index": 0, "delta": {"content": f" t{token}"}}
                else:
                    choice = {"index": 0, "text": f" t{token}"}
                choice["finish_reason"] = "length" if made == max_tokens else None
                self.event({"id": "gen", "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]})
            if usage:
                u = {"prompt_tokens": len(prompt), "completion_tokens": made, "total_tokens": len(prompt) + made}
                self.event({"id": "gen", "choices": [], "usage": u})
            self.event("[DONE]")
            self.chunk(b"")

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "9100")), help="HTTP port (default $PORT, else 9100)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    p.add_argument("--shape", default="1b", help="the decoder's shape: 1b or tiny (llm_model.py)")
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--max-len", type=int, default=4096, help="the longest prompt plus answer, tokens (default 4096)")
    p.add_argument("--warmup", type=int, default=3, help="requests of 16 tokens run before /healthz answers 200 (default 3)")
    p.add_argument(
        "--runner",
        default="eager",
        choices=["eager", "compiled"],
        help="eager (DynamicCache) or compiled (StaticCache, torch.compile reduce-overhead): llm_model.py",
    )
    a = p.parse_args()

    # Imported here so --help works without torch.
    import torch

    from llm_model import CompiledGenerator, build, generate

    pod = os.environ.get("POD") or socket.gethostname()
    model, config = build(a.shape, a.precision, a.device, a.max_len)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device
    if a.runner == "compiled":
        gen = CompiledGenerator(model, a.max_len, a.device)
    else:
        gen = lambda prompt, n: generate(model, prompt, n, a.device)  # noqa: E731
    server = Server(gen)
    httpd = Listener((a.host, a.port), handler_for(server, a.max_len, config.vocab_size))
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    start = time.perf_counter()
    for _ in range(a.warmup):
        for _token in gen(list(range(100, 116)), 16):
            pass
    server.is_ready.set()
    params = sum(t.numel() for t in model.parameters())
    print(
        f"{pod}: Llama-style decoder {a.shape} ({params / 1e9:.2f} B parameters) {a.precision} {a.runner} on {name}, "
        f"torch {torch.__version__}, warm in {time.perf_counter() - start:.1f} s, listening on {a.host}:{a.port}",
        flush=True,
    )
    # The main thread, which built and warmed the model, runs every generation.
    server.work(stop)
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
