#!/usr/bin/env python3
"""focus serve through the official openai client and raw HTTP, on loopback only.

On a tiny LLaMA the test trains (configs/tiny.conf, a router included; needs ../shared/data) and
on SmolLM2-135M-Instruct (cache/models, skipped without it): at temperature 0 the streamed text
equals the unstreamed text and `focus generate`'s greedy output; usage counts equal the
tokenizer's; eight concurrent clients each get the text of their request served alone; every bad
input gets a JSON error with a 4xx status and a good request still succeeds after it; a client
that drops mid-stream is cancelled and the next request is served; a full KV cache ends with
finish_reason "length"; a full queue answers 503 with Retry-After; --api-key; an idle connection
times out; SIGTERM during a stream lets it finish and exits 0. Every wait is bounded. (What
needs generations that last, a dropped stream, the queue, SIGTERM mid-stream, runs on SmolLM2.)
usage: serve_api.py FOCUS SRC"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.client

try:
    import openai
except ImportError:
    print("serve_api: skipped (the openai package is not installed: scripts/install_deps.sh)")
    sys.exit(77)

FOCUS, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.chdir(SRC)
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
        print(f"  ok   {what}", flush=True)
    else:
        failed += 1
        print(f"  FAIL {what}", flush=True)


class Server:
    def __init__(self, args, wait_ready=True):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.p = subprocess.Popen([FOCUS, "serve", "--port", "0"] + args, stdout=self.log,
                                  stderr=subprocess.STDOUT)
        self.port = None
        t0 = time.time()
        while time.time() - t0 < 60 and self.port is None and self.p.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log.name).read())
            if m:
                self.port = int(m.group(1))
            time.sleep(0.02)
        if self.port is None:
            raise RuntimeError("server did not start: " + open(self.log.name).read())
        self.health = []
        while wait_ready and time.time() - t0 < 120:
            st, body = self.request("GET", "/health")
            self.health.append((st, body))
            if st == 200:
                break
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1",
                                    api_key="none", timeout=120, max_retries=0)

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = r.read()
        self.last_headers = dict(r.getheaders())
        c.close()
        try:
            return r.status, json.loads(out)
        except ValueError:
            return r.status, out.decode("utf-8", "replace")

    def metric(self, name):
        st, text = self.request("GET", "/metrics")
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -999
        finally:
            self.log.close()

    def output(self):
        return open(self.log.name).read()


def generate(model_args, prompt, n):
    out = subprocess.run([FOCUS, "generate"] + model_args + ["--prompt", prompt, "-n", str(n)],
                         capture_output=True, text=True, timeout=300).stdout
    assert out.startswith(prompt), out
    return out[len(prompt):-1]  # generate ends with a newline


def completion_text(s, prompt, n, stream=False, **kw):
    if not stream:
        r = s.client.completions.create(model=s.name, prompt=prompt, max_tokens=n, temperature=0,
                                        **kw)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    for ch in s.client.completions.create(model=s.name, prompt=prompt, max_tokens=n,
                                          temperature=0, stream=True,
                                          stream_options={"include_usage": True}, **kw):
        if ch.choices:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    return text, finish, usage


def suite(s, label, model_args):
    """What every server must do, on this model."""
    st, models = s.request("GET", "/v1/models")
    s.name = models["data"][0]["id"]
    check(st == 200 and models["object"] == "list", f"{label}: GET /v1/models ({s.name})")
    check(all(h[0] in (200, 503) for h in s.health) and s.health[-1][0] == 200 and
          all(h[1] == {"status": "loading model"} for h in s.health if h[0] == 503),
          f"{label}: /health 503 while loading ({sum(h[0] == 503 for h in s.health)} seen), "
          "then 200")
    prompt, n = "The king said to the", 20
    a, fa, ua = completion_text(s, prompt, n)
    b, fb, ub = completion_text(s, prompt, n, stream=True)
    ref = generate(model_args, prompt, n)
    check(a == b and fa == fb, f"{label}: completions streamed = unstreamed ({a!r})")
    check(a == ref, f"{label}: = focus generate's greedy output ({ref!r})")
    st, tk = s.request("POST", "/tokenize", {"content": prompt, "add_special": True})
    check(ua.prompt_tokens == len(tk["tokens"]) and ub.prompt_tokens == ua.prompt_tokens,
          f"{label}: usage.prompt_tokens = the tokenizer's ({ua.prompt_tokens})")
    st, tc = s.request("POST", "/tokenize", {"content": a})
    want = n if fa == "length" else ua.completion_tokens
    # (the tiny model's text, runs of newlines, tokenizes back into fewer, merged tokens)
    check(ua.completion_tokens == want and ub.completion_tokens == want and
          ua.total_tokens == ua.prompt_tokens + ua.completion_tokens and
          (fa != "length" or len(tc["tokens"]) == n or label.startswith("tiny")),
          f"{label}: usage.completion_tokens = the tokens generated ({want}; the text's tokens "
          f"{len(tc['tokens'])})")
    st, dt = s.request("POST", "/detokenize", {"tokens": tk["tokens"]})
    check(st == 200 and dt["content"].endswith(prompt), f"{label}: /detokenize inverts /tokenize")
    # chat, streamed and not
    msgs = [{"role": "user", "content": "Say something about the sea."}]
    r = s.client.chat.completions.create(model=s.name, messages=msgs, max_tokens=16, temperature=0)
    roles, text = [], ""
    for ch in s.client.chat.completions.create(model=s.name, messages=msgs, max_tokens=16,
                                               temperature=0, stream=True):
        if ch.choices and ch.choices[0].delta.role:
            roles.append(ch.choices[0].delta.role)
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
    check(r.choices[0].message.role == "assistant" and r.choices[0].message.content == text and
          roles == ["assistant"],
          f"{label}: chat streamed = unstreamed, the role in the first delta ({text!r})")
    # a chat that goes on: the earlier turns come from the slot's cache
    msgs2 = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "And about the sky?"}]
    r2 = s.client.chat.completions.create(model=s.name, messages=msgs2, max_tokens=8,
                                          temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    if 2 * r.usage.prompt_tokens >= r2.usage.prompt_tokens:
        check(cached >= r.usage.prompt_tokens and cached < r2.usage.prompt_tokens,
              f"{label}: a chat that goes on evaluates only its new tokens ({cached} of "
              f"{r2.usage.prompt_tokens} cached)")
    else:  # less than half in common: a fresh evaluation, as llama-server's similarity rule
        check(cached == 0, f"{label}: a prompt sharing less than half with a slot starts afresh")
    # stop strings
    stop_at = a[3:9] if len(a) > 9 else None
    if stop_at:
        t, f, _ = completion_text(s, prompt, n, stop=[stop_at])
        check(t == a[:a.index(stop_at)] and f == "stop",
              f"{label}: a stop string ends the text before it ({stop_at!r})")
    # eight concurrent clients, each text that of its request alone
    prompts = [f"{w} of the night," for w in
               ["First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth"]]
    alone = [completion_text(s, p, 24)[0] for p in prompts]
    together = [None] * 8

    def client(i):
        together[i] = completion_text(s, prompts[i], 24, stream=i % 2 == 1)[0]
    th = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=300)
    check(together == alone, f"{label}: 8 concurrent clients, each text = served alone "
          f"({time.time() - t0:.1f} s)")
    rows, steps = s.metric("focus_decode_rows_total"), s.metric("focus_decode_steps_total")
    check(rows is not None and steps and rows / steps > 1.0,
          f"{label}: decode steps batched ({rows / steps:.2f} rows a step on average)")


def bad_inputs(s, label, ctx):
    """Each bad request: a JSON error with a 4xx status; then a good request still succeeds."""
    cases = [
        ("malformed JSON", "/v1/completions", b'{"prompt": "hi", ', 400),
        ("a body that is not an object", "/v1/completions", b'[1, 2]', 400),
        ("no prompt", "/v1/completions", {"max_tokens": 4}, 400),
        ("prompt of the wrong type", "/v1/completions", {"prompt": 5}, 400),
        ("max_tokens a string", "/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400),
        ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400),
        ("max_tokens beyond the context", "/v1/completions",
         {"prompt": "hi", "max_tokens": ctx + 1}, 400),
        ("temperature a string", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
        ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400),
        ("stop of the wrong type", "/v1/completions", {"prompt": "hi", "stop": 3}, 400),
        ("five stop strings", "/v1/completions", {"prompt": "hi", "stop": list("abcde")}, 400),
        ("n = 2", "/v1/completions", {"prompt": "hi", "n": 2}, 400),
        ("tools (not supported)", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "tools": []}, 400),
        ("response_format json_object (not supported)", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_object"}}, 400),
        ("best_of 2", "/v1/completions", {"prompt": "hi", "best_of": 2}, 400),
        ("top_k -1", "/v1/completions", {"prompt": "hi", "top_k": -1}, 400),
        ("min_p 2", "/v1/completions", {"prompt": "hi", "min_p": 2}, 400),
        ("frequency_penalty 3", "/v1/completions", {"prompt": "hi", "frequency_penalty": 3}, 400),
        ("repeat_penalty 0", "/v1/completions", {"prompt": "hi", "repeat_penalty": 0}, 400),
        ("logit_bias of a non-id", "/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}},
         400),
        ("logit_bias beyond 100", "/v1/completions", {"prompt": "hi", "logit_bias": {"1": 101}},
         400),
        ("logprobs 21", "/v1/completions", {"prompt": "hi", "logprobs": 21}, 400),
        ("top_logprobs without logprobs", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400),
        ("stream not a bool", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400),
        ("a token id outside the vocabulary", "/v1/completions", {"prompt": [1, 10 ** 9]}, 400),
        ("a prompt longer than the context", "/v1/completions", {"prompt": [1] * (ctx + 1)}, 400),
        ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404),
        ("messages missing", "/v1/chat/completions", {"max_tokens": 4}, 400),
        ("messages not an array", "/v1/chat/completions", {"messages": "hi"}, 400),
        ("a message without a role", "/v1/chat/completions", {"messages": [{"content": "x"}]},
         400),
        ("an unknown role", "/v1/chat/completions",
         {"messages": [{"role": "wizard", "content": "x"}]}, 400),
        ("an image part", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         400),
        ("detokenize a bad id", "/detokenize", {"tokens": [-1]}, 400),
        ("tokenize without content", "/tokenize", {"text": "x"}, 400),
        ("an unknown endpoint", "/v1/embeddings", {"input": "x"}, 404),
        ("data after the JSON object", "/v1/completions", b'{"prompt": "hi"} x', 400),
        ("two JSON objects", "/v1/completions", b'{"prompt": "hi"}{"prompt": "ho"}', 400),
        ("a key twice", "/v1/completions", b'{"prompt": "hi", "prompt": "ho"}', 400),
        ("a key twice, nested", "/v1/chat/completions",
         b'{"messages": [{"role": "user", "role": "system", "content": "x"}]}', 400),
        ("a NUL escaped in the prompt", "/v1/completions", b'{"prompt": "hi\\u0000there"}', 400),
        ("a NUL escaped in a role", "/v1/chat/completions",
         b'{"messages": [{"role": "user\\u0000x", "content": "x"}]}', 400),
        ("a NUL escaped in the model", "/v1/completions",
         b'{"prompt": "hi", "model": "a\\u0000b"}', 400),
        ("a raw NUL byte", "/v1/completions", b'{"prompt": "hi\x00there"}', 400),
    ]
    for what, path, body, want in cases:
        st, r = s.request("POST", path, body)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        good, _ = s.request("POST", "/v1/completions",
                            {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
        check(st == want and err.get("message") and err.get("type") and good == 200,
              f"{label}: {what}: {st} {err.get('message', r)!r:.90}, then a good request")
    st, r = s.request("GET", "/v1/completions")
    check(st == 405 and s.last_headers.get("Allow") == "POST",
          f"{label}: GET on a POST endpoint: 405 with Allow: POST")
    st, r = s.request("POST", "/v1/completions", b'{"prompt": "a \\\\u0000 is text"}')
    check(st == 200, f"{label}: an escaped backslash before u0000 is text, not a NUL")
    # a body over the limit (4 MiB): refused at its headers, before it is sent
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 5000000\r\n\r\n")
    head = sock.recv(4096)
    sock.close()
    # ... and one that says nothing of its size (chunked) refused when it passes the limit
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    try:
        piece = b"a" * (1 << 20)
        for _ in range(5):
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\n\r\n")
        st2 = c.getresponse().status
    except (BrokenPipeError, ConnectionResetError):
        st2 = 413  # closed after its answer
    c.close()
    good, _ = s.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    check(head.startswith(b"HTTP/1.1 413") and b"over the limit" in head and st2 == 413 and
          good == 200, f"{label}: a body over the limit: 413 (announced or chunked), then a good "
          "request")


def sampling_and_logprobs(s, label):
    """logprobs in the OpenAI shapes (completions and chat, streamed = unstreamed), logit_bias,
    top_k / min_p that leave one token (= greedy), the penalties, /props and /slots."""
    prompt = "The capital of France is"
    r = s.client.completions.create(model=s.name, prompt=prompt, max_tokens=12, temperature=0,
                                    logprobs=3)
    ch = r.choices[0]
    lp = ch.logprobs
    top_ok = all(len(d) <= 3 and abs(max(d.values()) - x) < 1e-5
                 for d, x in zip(lp.top_logprobs, lp.token_logprobs))
    check("".join(lp.tokens) == ch.text and len(lp.tokens) == r.usage.completion_tokens and
          top_ok and all(x <= 0 for x in lp.token_logprobs) and lp.text_offset[0] == 0,
          f"{label}: completion logprobs: tokens make the text, greedy picks each top "
          f"({lp.tokens[:3]}, {lp.token_logprobs[0]:.3f})")
    streamed = []
    for c in s.client.completions.create(model=s.name, prompt=prompt, max_tokens=12,
                                         temperature=0, logprobs=3, stream=True):
        if c.choices and c.choices[0].logprobs:
            streamed += c.choices[0].logprobs.token_logprobs
    check(streamed == lp.token_logprobs,
          f"{label}: streamed logprobs = unstreamed ({len(streamed)} tokens)")
    msgs = [{"role": "user", "content": "Name a colour."}]
    r = s.client.chat.completions.create(model=s.name, messages=msgs, max_tokens=8,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    joined = b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace")
    check(joined == r.choices[0].message.content and
          all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content),
          f"{label}: chat logprobs: the tokens' bytes make the answer, top 2 each "
          f"({joined!r})")
    # logit_bias: -100 bans the greedy first token, +100 forces a token
    first = lp.tokens[0]
    tid = s.request("POST", "/tokenize", {"content": first})[1]["tokens"][-1]
    banned = s.client.completions.create(model=s.name, prompt=prompt, max_tokens=1,
                                         temperature=0, logit_bias={str(tid): -100})
    forced = s.client.completions.create(model=s.name, prompt=prompt, max_tokens=3,
                                         temperature=0.7, seed=1, logit_bias={str(tid): 100})
    check(banned.choices[0].text != first and forced.choices[0].text == first * 3,
          f"{label}: logit_bias -100 bans {first!r} (got {banned.choices[0].text!r}), +100 "
          f"forces it ({forced.choices[0].text!r})")
    greedy = completion_text(s, "Once upon a time", 16)[0]

    def sampled(**kw):
        st, body = s.request("POST", "/v1/completions",
                             dict({"prompt": "Once upon a time", "max_tokens": 16,
                                   "temperature": 1.5, "seed": 7}, **kw))
        return body["choices"][0]["text"] if st == 200 else None
    check(sampled(top_k=1) == greedy and sampled(min_p=1.0) == greedy and
          sampled() != greedy,
          f"{label}: top_k 1 and min_p 1 at temperature 1.5 give the greedy text; neither: not")
    rep = "one two one two one two one two one two"

    def greedy_with(**kw):
        return s.request("POST", "/v1/completions",
                         dict({"prompt": rep, "max_tokens": 12, "temperature": 0}, **kw))[1][
                             "choices"][0]["text"]
    plain = greedy_with()
    check(greedy_with(frequency_penalty=0, presence_penalty=0, repeat_penalty=1) == plain and
          greedy_with(frequency_penalty=2) != plain and greedy_with(presence_penalty=2) != plain
          and greedy_with(repeat_penalty=1.8) != plain,
          f"{label}: neutral penalties keep the greedy text ({plain!r}); each penalty changes it")
    st, props = s.request("GET", "/props")
    st2, slots = s.request("GET", "/slots")
    check(st == 200 and props["total_slots"] == len(slots) and
          props["default_generation_settings"]["n_ctx"] == slots[0]["n_ctx"] and st2 == 200 and
          all("is_processing" in x for x in slots),
          f"{label}: /props and /slots ({len(slots)} slots of {slots[0]['n_ctx']} tokens)")


def hostile_connections(model_args, label):
    """Idle connections beyond the limit and slowloris clients (a header line every 0.3 s) do
    not keep a normal client out: /health and a completion are answered while they hold their
    sockets; a slow request is closed at its deadline; a per-client limit holds; the HTTP
    library's log lines stay few."""
    s = Server(model_args + ["--parallel", "1", "--ctx", "256", "--timeout", "3",
                             "--max-connections", "32", "--max-per-client", "0"])
    s.name = s.request("GET", "/v1/models")[1]["data"][0]["id"]
    idle = []
    for _ in range(60):
        try:
            idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
        except OSError:
            pass
    slow = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(6)]
    for k in slow:
        k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    stop = threading.Event()
    closed_at = {}

    def drip():
        t0 = time.time()
        while not stop.is_set() and time.time() - t0 < 12:
            for i, k in enumerate(slow):
                if i in closed_at:
                    continue
                try:
                    k.sendall(b"X-Drip: 1\r\n")
                except OSError:
                    closed_at[i] = time.time() - t0
            time.sleep(0.3)
    th = threading.Thread(target=drip)
    th.start()
    time.sleep(1.5)  # the idle ones are now older than the guard's grace for making room
    t0 = time.time()
    st, _ = s.request("GET", "/health", timeout=10)
    health_s = time.time() - t0
    t0 = time.time()
    st2, body = s.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4,
                                                      "temperature": 0}, timeout=20)
    comp_s = time.time() - t0
    check(st == 200 and health_s < 3 and st2 == 200,
          f"{label}: with 60 idle and 6 slowloris connections against --max-connections 32, "
          f"/health answers in {health_s:.2f} s and a completion in {comp_s:.2f} s")
    th.join(timeout=20)
    stop.set()
    # (the deadline counts from when the server took the connection: these waited in the
    # listen queue while the server was full)
    check(len(closed_at) == len(slow) and max(closed_at.values()) < 10,
          f"{label}: slowloris connections closed by the 3 s deadline although they keep sending "
          f"(after {sorted(round(v, 1) for v in closed_at.values())} s)")
    st, text = s.request("GET", "/metrics")
    closed = s.metric("focus_connections_closed_total")
    check(closed and closed >= len(slow), f"{label}: /metrics counts {closed} connections closed")
    for k in idle + slow:
        k.close()
    check(s.stop() == 0, f"{label}: exit 0")
    lines = [ln for ln in s.output().splitlines() if "focus serve: http:" in ln]
    check(len(lines) <= 5, f"{label}: the HTTP library's log kept to {len(lines)} lines")
    # one address at most --max-per-client connections
    s = Server(model_args + ["--parallel", "1", "--ctx", "256", "--max-per-client", "3"])
    held = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(3)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        got = extra.recv(100)
    except OSError:
        got = b""
    extra.close()
    for k in held:
        k.close()
    time.sleep(0.3)
    st, _ = s.request("GET", "/health")
    check(got == b"" and st == 200,
          f"{label}: a fourth connection from one address beyond --max-per-client 3 is closed "
          f"unanswered; once they close, /health answers")
    check(s.stop() == 0, f"{label}: exit 0")


def drop_mid_stream(s, label):
    before = s.metric("focus_requests_cancelled_total")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0,
                       "stream": True, "model": s.name}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(4096)
    sock.close()
    t0 = time.time()
    while time.time() - t0 < 20 and s.metric("focus_requests_cancelled_total") == before:
        time.sleep(0.1)
    after = s.metric("focus_requests_cancelled_total")
    st, r = s.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
    check(after == before + 1 and st == 200 and s.metric("focus_slots_busy") == 0,
          f"{label}: a client that drops mid-stream is cancelled, its slot freed "
          f"({time.time() - t0:.1f} s), the next request served")


def tiny_checks(tiny_args, ctx):
    """Server settings of their own: a full KV cache, a full queue, an API key, idle timeouts,
    SIGTERM during a stream."""
    s = Server(tiny_args + ["--ctx", "64", "--parallel", "1", "--queue", "1", "--timeout", "2",
                            "--api-key", "sesame"])
    auth = {"Authorization": "Bearer sesame"}
    st, r = s.request("POST", "/v1/completions", {"prompt": "hi"})
    st2, _ = s.request("POST", "/v1/completions", {"prompt": "hi"},
                       {"Authorization": "Bearer wrong"})
    st3, h = s.request("GET", "/health")
    st4, ok = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, auth)
    www = s.last_headers.get("WWW-Authenticate")
    check(st == 401 and st2 == 401 and r["error"]["code"] == "invalid_api_key" and st3 == 200 and
          st4 == 200, "--api-key: missing or wrong key 401, /health open, the key works")
    st, _ = s.request("POST", "/v1/completions", {"prompt": "hi"})
    check(st == 401 and s.last_headers.get("WWW-Authenticate") == "Bearer",
          "401 says how to authenticate (WWW-Authenticate: Bearer)")
    del www
    ids = [5] * 60
    st, r = s.request("POST", "/v1/completions", {"prompt": ids, "max_tokens": 50,
                                                  "temperature": 0}, auth)
    check(st == 200 and r["choices"][0]["finish_reason"] == "length" and
          r["usage"]["completion_tokens"] == 64 - 60 + 1,
          f"a full KV cache ends the request with finish_reason length "
          f"({r['usage']['completion_tokens']} tokens after 60 of 64)")
    # an idle connection (half a request) is closed after --timeout 2
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    t0 = time.time()
    try:
        data = sock.recv(100)
    except (ConnectionResetError, socket.timeout):
        data = b""
    check(data == b"" and time.time() - t0 < 10,
          f"a half-sent request times out ({time.time() - t0:.1f} s)")
    sock.close()
    st, _ = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, auth)
    check(st == 200, "served after the timeout")
    check(s.stop() == 0, "exit 0 on SIGTERM")


def open_stream(port, body):
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(dict(body, stream=True)).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def read_until(sock, got, mark, limit=60):
    """got and what sock sends after it, until mark is in it, the socket closes or limit
    seconds pass"""
    t0 = time.time()
    while mark not in got and time.time() - t0 < limit:
        more = sock.recv(65536)
        if not more:
            break
        got += more
    return got


def slow_checks(model_args, label):
    """What needs generations that last (SmolLM2: about 100 tokens/s here): a full queue, and
    SIGTERM during a stream."""
    s = Server(model_args + ["--parallel", "1", "--queue", "1", "--ctx", "2048", "--timeout", "1"])
    # a request that runs longer than the idle timeout is not cut: the timeout is for idle
    # connections, not for generations
    # (about 1,760 prompt tokens and up to 128 more: 1.2 s or more on a 2-core AMD EPYC, where
    # 1,320 tokens and 4 more took 0.9 s after the prompt's tiles got faster)
    long_prompt = " ".join(["the river ran past the old mill and on to the sea"] * 160)
    t0 = time.time()
    st, r = s.request("POST", "/v1/completions", {"prompt": long_prompt, "max_tokens": 128,
                                                  "temperature": 0})
    took = time.time() - t0
    check(st == 200 and r["usage"]["prompt_tokens"] > 1000 and took > 1,
          f"{label}: a request of {took:.1f} s (a long prompt) is served past --timeout 1")
    a = open_stream(s.port, {"prompt": "Once upon a time", "max_tokens": 2000})
    a.recv(4096)  # running in the one slot
    res = {}
    th = threading.Thread(target=lambda: res.update(
        b=s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4})))
    th.start()
    t0 = time.time()
    while s.metric("focus_queue_length") != 1 and time.time() - t0 < 20:
        time.sleep(0.05)
    st, r = s.request("POST", "/v1/completions", {"prompt": "Hey", "max_tokens": 4})
    retry = s.last_headers.get("Retry-After")
    a.close()  # the running one cancelled: the queued one goes on
    th.join(timeout=60)
    check(st == 503 and r["error"]["code"] == "queue_full" and retry == "1" and
          res.get("b", (0,))[0] == 200,
          f"{label}: a full queue answers 503 with Retry-After; the queued request is served "
          "once the slot frees")
    check(s.stop() == 0, f"{label}: exit 0")
    # SIGTERM during a stream: it finishes, then exit 0
    s = Server(model_args + ["--ctx", "2048"])
    sock = open_stream(s.port, {"prompt": "Once", "max_tokens": 60, "temperature": 0})
    # the first event, not only the headers: those leave when the job is queued, and a job
    # still queued at SIGTERM is cancelled by design (seen once in CI: 2 events, the error and
    # [DONE])
    got = read_until(sock, sock.recv(4096), b"data: ")
    s.p.send_signal(signal.SIGTERM)
    got = read_until(sock, got, b"[DONE]")
    sock.close()
    rc = s.stop()
    check(b"[DONE]" in got and b'"finish_reason":"length"' in got and rc == 0,
          f"{label}: SIGTERM during a stream: it finishes ({got.count(b'data: ')} events), "
          f"exit {rc}")


def raw_request(port, body, half_close=False, timeout=120):
    """A request on a socket of its own; half_close: shutdown(SHUT_WR) after it, as nc -N.
    Returns the whole answer's bytes (the server closes after it: Connection: close)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            more = sock.recv(65536)
            if not more:
                break
            got += more
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    return got


def cache_and_fairness(smol, label):
    """The same answer whatever ran on the slot before; the queue counts slots and waiting
    requests together; a half-closed client gets its answer; a long prompt neither stalls a
    running stream nor a short request; SIGTERM lets a running request end with an answer."""
    s = Server(["--model", smol, "--parallel", "1", "--ctx", "4096", "--queue", "2"])
    st, models = s.request("GET", "/v1/models")
    s.name = models["data"][0]["id"]

    def chat(text, n=24):
        r = s.client.chat.completions.create(model=s.name, max_tokens=n, temperature=0,
                                             messages=[{"role": "user", "content": text}])
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens
    rivers, _ = chat("Name three rivers.")
    chat("Tell me a joke.")
    again, cached = chat("Name three rivers.")
    check(again == rivers and cached > 0,
          f"{label}: a chat's answer is the same after another used the slot ({cached} prompt "
          f"tokens reused; {rivers[:40]!r})")
    a1 = completion_text(s, "The old house by the river had a garden where", 24)[0]
    completion_text(s, "The old house by the river had a cellar in which", 24)
    a2, _, u = completion_text(s, "The old house by the river had a garden where", 24)
    check(a1 == a2 and u.prompt_tokens_details.cached_tokens > 0,
          f"{label}: a completion sharing a prefix with the last one: the same text")
    # a half-closed client (nc -N) gets its answer
    got = raw_request(s.port, {"prompt": "Hello", "max_tokens": 4, "temperature": 0},
                      half_close=True)
    check(got.startswith(b"HTTP/1.1 200") and b'"choices"' in got,
          f"{label}: a client that half-closes after its request gets the answer")
    # a running stream, then a long prompt: the stream goes on, a short request gets in
    check(s.stop() == 0, f"{label}: exit 0")
    s = Server(["--model", smol, "--parallel", "3", "--ctx", "4096"])
    s.name = s.request("GET", "/v1/models")[1]["data"][0]["id"]
    # 2000 tokens: the stream must outlast the long prompt however fast decoding is (400 tokens
    # ended within the first second here once decoding reached 400 tokens/s)
    sock = open_stream(s.port, {"prompt": "Once upon a time", "max_tokens": 2000,
                                "temperature": 0})
    sock.settimeout(30)
    stamps, buf = [], b""

    def reader():
        nonlocal buf
        while True:
            try:
                more = sock.recv(65536)
            except (OSError, socket.timeout):
                break
            if not more:
                break
            buf += more
            stamps.append((time.time(), more.count(b"data: ")))
    rt = threading.Thread(target=reader)
    rt.start()
    t0 = time.time()
    while sum(n for _, n in stamps) < 20 and time.time() - t0 < 30:
        time.sleep(0.01)
    long_prompt = " ".join(["the river ran past the old mill and on to the sea"] * 180)
    res = {}

    def long_req():
        t0 = time.time()
        res["long"] = s.request("POST", "/v1/completions",
                                {"prompt": long_prompt, "max_tokens": 1, "temperature": 0})
        res["long_s"] = time.time() - t0
    lt = threading.Thread(target=long_req)
    t_long = time.time()
    lt.start()
    time.sleep(0.3)
    t0 = time.time()
    short = s.client.completions.create(model=s.name, prompt="Hi", max_tokens=1, temperature=0)
    short_s = time.time() - t0
    lt.join(timeout=300)
    t_end = time.time()
    ended = b"[DONE]" in buf
    sock.close()
    rt.join(timeout=30)
    during = [t for t, _ in stamps if t_long <= t <= t_end]
    gaps = [b - a for a, b in zip(during, during[1:])]
    worst = max(gaps) if gaps else float("inf")
    check(res.get("long", (0,))[0] == 200 and res["long"][1]["usage"]["prompt_tokens"] > 1500 and
          worst < 1.5 and short_s < 2.0,
          f"{label}: while a prompt of {res.get('long', (0, {}))[1].get('usage', {}).get('prompt_tokens')} "
          f"tokens is evaluated ({res.get('long_s', 0):.1f} s) the running stream pauses at most "
          f"{worst:.2f} s, a short request answers in {short_s:.2f} s"
          + (" (the stream ended before the long prompt did)" if ended else ""))
    check(s.stop() == 0, f"{label}: exit 0")
    # SIGTERM with a short grace: a running unstreamed request gets an answer, not a closed socket
    s = Server(["--model", smol, "--parallel", "1", "--ctx", "2048", "--grace", "1"])
    out = {}
    th = threading.Thread(target=lambda: out.update(
        got=raw_request(s.port, {"prompt": "Once", "max_tokens": 1500, "temperature": 0})))
    th.start()
    time.sleep(1.5)
    s.p.send_signal(signal.SIGTERM)
    th.join(timeout=60)
    rc = s.stop()
    got = out.get("got", b"")
    check(rc == 0 and (got.startswith(b"HTTP/1.1 503") and b"shutting" in got or
                       got.startswith(b"HTTP/1.1 200")),
          f"{label}: SIGTERM past --grace 1: the running request gets {got[:12]!r}, exit {rc}")
    # --queue 0, two slots: two requests at once on an idle server are both served
    s = Server(["--model", smol, "--parallel", "2", "--queue", "0", "--ctx", "512"])
    codes = [None, None]

    def one(i):
        codes[i] = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 8})[0]
    th = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=120)
    check(codes == [200, 200], f"{label}: --parallel 2 --queue 0: two requests at once both "
          f"served ({codes})")
    check(s.stop() == 0, f"{label}: exit 0")


def main():
    work = tempfile.mkdtemp()
    try:
        if os.path.isdir("../shared/data/tinyshakespeare"):
            small = ["--set", "pretrain_steps=30", "--set", "pretrain_B=2", "--set", "steps=4",
                     "--set", "B=2", "--set", "T=64", "--set", "eval_every=4", "--set",
                     "eval_tokens=256", "--set", "warmup=2"]
            subprocess.run([FOCUS, "retrofit", "--config", "configs/tiny.conf", *small, "--out",
                            f"{work}/run"], check=True, capture_output=True, timeout=600)
            tiny = ["--model", f"{work}/run/base.gguf", "--tokenizer",
                    "../shared/data/gpt2-tokenizer", "--router", f"{work}/run/router.h5",
                    "--topk", "1"]
            s = Server(tiny + ["--chat-template", "chatml", "--parallel", "4", "--ctx", "256"])
            suite(s, "tiny + router", tiny)
            bad_inputs(s, "tiny", 256)
            check(s.stop() == 0, "tiny: exit 0 on SIGTERM")
            tiny_checks(tiny, 256)
        else:
            print("serve_api: the tiny-model part skipped (no ../shared/data)")
        smol = "cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        if os.path.exists(smol):
            s = Server(["--model", smol, "--parallel", "4", "--ctx", "2048"])
            suite(s, "SmolLM2", ["--model", smol])
            sampling_and_logprobs(s, "SmolLM2")
            drop_mid_stream(s, "SmolLM2")
            check(s.stop() == 0, "SmolLM2: exit 0 on SIGTERM")
            slow_checks(["--model", smol], "SmolLM2")
            hostile_connections(["--model", smol], "SmolLM2")
            cache_and_fairness(smol, "SmolLM2")
        else:
            print("serve_api: the SmolLM2 part skipped (scripts/fetch_model.sh)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"serve_api: {passed} passed, {failed} failed")
    if passed == 0:
        sys.exit(77)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
