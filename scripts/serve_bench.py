#!/usr/bin/env python3
"""Serving throughput of `focus serve` (and of llama-server, when given one) on the same GGUF file:
for 1, 2, 4 and 8 concurrent clients, each sending streamed completions (temperature 0), the time
to first token, tokens/s per request, total tokens/s, and the server's resident memory.

usage: scripts/serve_bench.py [--model M] [--focus build/focus] [--llama-server PATH]
                              [--clients 1,2,4,8] [--tokens 64] [--prompt-tokens 0|8000]
                              [--requests 2] [--router R --topk k] [--set w=N] [--threads 2]
                              [--no-focus] [--fairness]
Prints one Markdown table (the rows of docs/RESULTS.md); --prompt-tokens N sends prompts of about
N tokens (public-domain-like filler generated from a seed) instead of short ones.
--fairness (with --prompt-tokens N, 3 slots): a prompt of N tokens alone (one token generated),
then the same length while another slot streams and a short request arrives 0.3 s after it: the
longest pause of the stream while the long prompt is evaluated, the short request's time to its
first token, and the long prompt's time against its time alone."""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--focus", default="build/focus")
ap.add_argument("--llama-server", default=None)
ap.add_argument("--clients", default="1,2,4,8")
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--prompt-tokens", type=int, default=0)
ap.add_argument("--requests", type=int, default=2, help="requests per client")
ap.add_argument("--router", default=None)
ap.add_argument("--topk", default="1")
ap.add_argument("--set", action="append", default=[], help="focus serve --set key=value")
ap.add_argument("--no-focus", action="store_true", help="llama-server only")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--fairness", action="store_true",
                help="a long prompt beside a running stream and a short request")
a = ap.parse_args()
if a.fairness:
    if not a.prompt_tokens:
        sys.exit("serve_bench: --fairness needs --prompt-tokens N")
    a.clients = "3"
clients = [int(c) for c in a.clients.split(",")]
P = max(clients)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(kind):
    port = free_port()
    ctx = max(8192, a.prompt_tokens + 64) if a.prompt_tokens else 2048
    if kind == "focus":
        cmd = [a.focus, "serve", "--model", a.model, "--port", str(port), "--parallel", str(P),
               "--ctx", str(ctx)]
        if a.router:
            cmd += ["--router", a.router, "--topk", a.topk]
        for kv in a.set:
            cmd += ["--set", kv]
    else:  # llama-server: the whole context shared by the slots, as its -c means
        cmd = [a.llama_server, "-m", a.model, "--port", str(port), "-np", str(P), "-c",
               str(ctx * P), "-t", str(a.threads), "--no-webui"]
    log = tempfile.TemporaryFile()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.time()
    while time.time() - t0 < 120:
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=1)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            if b" 200 " in c.recv(4096):
                c.close()
                return p, port
            c.close()
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    log.seek(0)
    sys.exit(f"{kind} did not start: {log.read().decode()[-2000:]}")


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0


def prompt_for(i, warm=False):
    if not a.prompt_tokens or warm:
        return f"Story {i}: once upon a time, in a land far away,"
    words = ["river", "stone", "light", "north", "garden", "letter", "winter", "bridge", "song",
             "candle", "harbor", "forest", "window", "silver", "morning", "journey"]
    x, out = 12345 + i, []
    while len(out) < a.prompt_tokens:  # more than a token a word: cut to length in ids
        x = (x * 1103515245 + 12345) % 2 ** 31
        out.append(words[x % len(words)])
    return f"Story {i}: " + " ".join(out) + ". The end of the story is"


def post(port, path, obj):
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    body = json.dumps(obj).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    buf = b""
    while True:
        more = s.recv(65536)
        if not more:
            break
        buf += more
    s.close()
    return json.loads(buf.split(b"\r\n\r\n", 1)[1])


def prompt_ids(port, i):
    """a long prompt as exactly --prompt-tokens token ids (the server's own tokenizer)"""
    ids = post(port, "/tokenize", {"content": prompt_for(i)})["tokens"]
    assert len(ids) >= a.prompt_tokens, (len(ids), a.prompt_tokens)
    return ids[:a.prompt_tokens]


def one(port, i, res, warm=False):
    prompt = prompt_for(i, warm) if not a.prompt_tokens or warm else prompt_ids(port, i)
    body = json.dumps({"prompt": prompt, "max_tokens": a.tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    t0 = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    buf, first, n = b"", None, 0
    while b"data: [DONE]" not in buf:
        more = s.recv(65536)
        if not more:
            break
        buf += more
        if first is None and b'"text":"' in buf.split(b"\r\n\r\n", 1)[-1]:
            first = time.time() - t0
    s.close()
    n = len(re.findall(rb'"text":"(?:[^"\\]|\\.)+"', buf))  # chunks with text: one a token
    res.append((first or 0, n, time.time() - t0))


def timed_post(port, body):
    t0 = time.time()
    r = post(port, "/v1/completions", body)
    return time.time() - t0, r


def fairness(kind):
    """the stream's longest pause, the short request's first token, the long prompt's time
    beside them and alone (seconds)"""
    p, port = start(kind)
    one(port, 0, [], warm=True)
    alone, _ = timed_post(port, {"prompt": prompt_ids(port, 1), "max_tokens": 1,
                                 "temperature": 0})
    long_ids = prompt_ids(port, 2)  # another text: nothing of it cached
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    stamps, stop = [], threading.Event()

    def reader():
        sock.settimeout(1)
        while not stop.is_set():
            try:
                more = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not more:
                break
            stamps.extend([time.time()] * more.count(b"data: "))
    rt = threading.Thread(target=reader)
    rt.start()
    time.sleep(2.0)
    res = {}

    def long_req():
        res["long"] = timed_post(port, {"prompt": long_ids, "max_tokens": 1, "temperature": 0})[0]
    lt = threading.Thread(target=long_req)
    t_long = time.time()
    lt.start()
    time.sleep(0.3)
    short = []
    one(port, 7, short, warm=True)  # a short prompt, streamed: its first token's time
    lt.join()
    t_end = time.time()
    stop.set()
    sock.close()
    rt.join()
    during = [t for t in stamps if t_long <= t <= t_end]
    gaps = [b - c for c, b in zip(during, during[1:])]
    if during:  # the first event after the long prompt began, the last one before it ended
        gaps += [during[0] - t_long, t_end - during[-1]]
    p.terminate()
    p.wait(timeout=60)
    worst = sorted(((b - c, c - t_long) for c, b in zip(during, during[1:])), reverse=True)[:5]
    print(f"{kind}: the longest pauses (s, at s after the long prompt began): "
          + ", ".join(f"{g:.2f} at {t:.1f}" for g, t in worst), file=sys.stderr)
    return max(gaps) if gaps else float("nan"), short[0][0], res["long"], alone


rows = []
kinds = ([] if a.no_focus else ["focus"]) + (["llama-server"] if a.llama_server else [])
if a.fairness:
    out = []
    for kind in kinds:
        pause, ttft, long_s, alone = fairness(kind)
        out.append((kind, pause, ttft, long_s, alone))
        print(f"{kind}: stream pause {pause:.2f} s, short ttft {ttft:.2f} s, long prompt "
              f"{long_s:.2f} s ({long_s / alone:.2f}x its {alone:.2f} s alone)", file=sys.stderr)
    print(f"\n| server | longest stream pause (s) | short request's first token (s) | "
          f"{a.prompt_tokens}-token prompt beside them (s) | alone (s) | ratio |")
    print("|---|---|---|---|---|---|")
    for kind, pause, ttft, long_s, alone in out:
        print(f"| {kind} | {pause:.2f} | {ttft:.2f} | {long_s:.2f} | {alone:.2f} | "
              f"{long_s / alone:.2f} |")
    sys.exit(0)
for kind in kinds:
    p, port = start(kind)
    one(port, 0, [], warm=True)  # warm-up (a short prompt)
    for c in clients:
        res, th = [], []
        t0 = time.time()
        for k in range(c):
            def work(k=k):
                for r in range(a.requests):
                    one(port, 100 * c + 10 * k + r, res)
            th.append(threading.Thread(target=work))
            th[-1].start()
        for t in th:
            t.join()
        wall = time.time() - t0
        toks = sum(r[1] for r in res)
        ttft = sorted(r[0] for r in res)[len(res) // 2]
        per = sorted(r[1] / max(r[2] - r[0], 1e-9) for r in res)[len(res) // 2]
        rows.append((kind, c, ttft, per, toks / wall, rss_mb(p.pid)))
        print(f"{kind:12s} clients {c}: ttft {ttft:.3f} s, {per:.1f} tok/s per request, "
              f"{toks / wall:.1f} tok/s total, RSS {rss_mb(p.pid):.0f} MB", file=sys.stderr)
    p.terminate()
    p.wait(timeout=60)

print(f"\n| server | clients | time to first token (median, s) | tokens/s per request (median) "
      f"| total tokens/s | resident MB |")
print("|---|---|---|---|---|---|")
for kind, c, ttft, per, tot, rss in rows:
    print(f"| {kind} | {c} | {ttft:.3f} | {per:.1f} | {tot:.1f} | {rss:.0f} |")
