#!/usr/bin/env python3
"""A multi-round conversation workload against OpenAI-compatible servers, restarted halfway.

U users (more than the server's slots) share a system prompt and each has a long context of
their own; each of R rounds asks every user one short question in turn (one request at a
time, so that time to first token measures the prompt's cost, not queueing) and streams a
short greedy answer. After round R/2 the server is stopped (SIGTERM) and started again on
the same cache. Servers: `kvtier` (kvtier-llama serve), `off` (kvtier-llama serve
--no-cache) and `llama-server` (llama.cpp's own server, its in-RAM prompt cache on).

Prints a table of time to first token per round and kind, and writes every request's
figures as JSON with --out. Standard library only.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORDS = ("the cache restores prefix of a long conversation from disk so that nothing is "
         "computed twice when server restarts model tokens state layer attention keys values "
         "user asks question answer context document section paragraph").split()


def text(seed, n_chars):
    """Deterministic words, about one token per character in the byte-level chat vocabulary."""
    x, out, size = (seed * 0x9E3779B97F4A7C15 + 1) & (2**64 - 1), [], 0
    while size < n_chars:
        x ^= (x << 13) & (2**64 - 1)
        x ^= x >> 7
        x ^= (x << 17) & (2**64 - 1)
        w = WORDS[x % len(WORDS)]
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, kind, a, cache_dir):
        self.kind, self.a, self.cache_dir, self.proc = kind, a, cache_dir, None

    def start(self):
        self.port = free_port()
        a, ctx = self.a, self.a.slot_ctx
        if self.kind == "llama-server":
            cmd = [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(self.port),
                   "-np", str(a.slots), "-c", str(ctx * a.slots), "-t", str(a.threads),
                   "--cache-ram", str(a.cache_ram_mib), "-a", "chat", "--no-webui"]
        else:
            cmd = [a.kvtier_llama, "serve", "-m", a.model, "--port", str(self.port), "--slots",
                   str(a.slots), "--ctx", str(ctx), "--threads", str(a.threads), "--alias", "chat"]
            cmd += ["--no-cache"] if self.kind == "off" else ["--cache-dir", self.cache_dir]
        self.log = open(os.path.join(a.workdir, f"{self.kind}.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        for _ in range(1200):
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                sys.exit(f"{self.kind} exited at start; see {self.log.name}")
            time.sleep(0.1)
        sys.exit(f"{self.kind} did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=300)
        self.log.close()

    def chat(self, messages, max_tokens):
        """Stream one greedy chat completion: (ttft s, total s, reply text, usage or {})."""
        body = json.dumps({"model": "chat", "messages": messages, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            sys.exit(f"{self.kind}: HTTP {r.status}: {r.read()[:300]}")
        ttft, reply, usage = None, [], {}
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    reply.append(piece)
            usage = ev.get("usage") or usage
            if "timings" in ev:  # llama-server: prompt tokens taken from its cache
                usage.setdefault("timings", ev["timings"])
        return ttft, time.perf_counter() - t0, "".join(reply), usage


def cached_tokens(usage):
    d = usage.get("prompt_tokens_details") or {}
    if "cached_tokens" in d:
        return d["cached_tokens"]
    t = usage.get("timings") or {}
    return t.get("cache_n")


def run(kind, a):
    cache = tempfile.mkdtemp(prefix=f"{kind}-", dir=a.workdir)
    srv = Server(kind, a, cache)
    srv.start()
    system = {"role": "system", "content": text(1, a.system)}
    convo = [[system, {"role": "user", "content": text(100 + u, a.context - a.system)}]
             for u in range(a.users)]
    rows, t_all = [], time.perf_counter()
    for rnd in range(a.rounds):
        if rnd == a.rounds // 2:
            srv.stop()
            srv.start()
        for u in range(a.users):
            convo[u][-1]["content"] += "\n" + text(1000 * rnd + u, a.question)
            ttft, total, reply, usage = srv.chat(convo[u], a.answer)
            rows.append({"kind": kind, "round": rnd + 1, "user": u, "ttft_s": ttft,
                         "total_s": total, "prompt_tokens": usage.get("prompt_tokens"),
                         "cached_tokens": cached_tokens(usage), "reply": reply})
            print(f"  {kind:12} round {rnd + 1} user {u}: ttft {ttft:.3f} s, "
                  f"cached {rows[-1]['cached_tokens']} of {rows[-1]['prompt_tokens']}",
                  file=sys.stderr, flush=True)
            convo[u] += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": ""}]
    srv.stop()
    return rows, time.perf_counter() - t_all


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvtier-llama", required=True)
    p.add_argument("--llama-server")
    p.add_argument("--model", required=True)
    p.add_argument("--kinds", default="kvtier,off,llama-server")
    p.add_argument("--users", type=int, default=6)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--context", type=int, default=8192, help="tokens of each user's context")
    p.add_argument("--system", type=int, default=1024, help="of which the shared system prompt")
    p.add_argument("--question", type=int, default=24)
    p.add_argument("--answer", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--cache-ram-mib", type=int, default=8192, help="llama-server's --cache-ram")
    p.add_argument("--workdir", default=tempfile.gettempdir())
    p.add_argument("--out")
    a = p.parse_args()
    a.slot_ctx = ((a.context + a.rounds * (a.question + a.answer + 32) + 255) // 256 + 1) * 256
    rows, totals = [], {}
    for kind in a.kinds.split(","):
        r, totals[kind] = run(kind, a)
        rows += r
    print(f"{a.users} users, {a.slots} slots, {a.rounds} rounds, {a.context}-token contexts "
          f"({a.system} shared), restart before round {a.rounds // 2 + 1}; TTFT p50 / p99 s")
    kinds = list(totals)
    print("| round | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for rnd in range(1, a.rounds + 1):
        cells = []
        for k in kinds:
            v = [x["ttft_s"] for x in rows if x["kind"] == k and x["round"] == rnd]
            cells.append(f"{statistics.median(v):.3f} / {pct(v, 99):.3f}")
        print(f"| {rnd} | " + " | ".join(cells) + " |")
    print("| total time s | " + " | ".join(f"{totals[k]:.1f}" for k in kinds) + " |")
    first = [r["reply"] for r in rows if r["kind"] == kinds[0]]
    for k in kinds[1:]:  # reused rows and recomputed ones sum in another order: near-ties flip
        same = sum(x == r["reply"] for x, r in zip(first, [r for r in rows if r["kind"] == k]))
        print(f"replies of {k} identical to {kinds[0]}'s: {same} of {len(first)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items()}, "totals": totals,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
