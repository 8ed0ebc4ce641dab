#!/usr/bin/env python3
"""sluice-proxy fuzzed from outside, both of its sides: the clients and the upstream.

    python3 tests/fuzz/proxy_blackbox.py --build build/asan [--side clients|upstream]
                                         [--seconds 300] [--seed 1] [--threads 4]
                                         [--admin-poll] [--proxy-arg ARG ...]

Runs BUILD's sluice-proxy (build it with the asan preset: the point is its reports) and
drives it until SECONDS pass or it dies:
  --side clients (the default): sluice-provider-sim streams behind the proxy, and THREADS
      clients send mutated requests (framing: Content-Length and chunked, wrong, both or
      huge; heads over the limits; folded, duplicated or control-character headers; the
      deadline headers; HEAD, GET, HTTP/1.0, absolute targets; random bytes), one to three
      pipelined on a connection, cut into random writes, then read, stop reading, hang up
      or reset;
  --side upstream: THREADS clients send plain and streamed chats (a quarter hang up after
      the first bytes: an answer read on) while the upstream is this script, answering
      each with a mutated response (status lines, Retry-After and rate-limit headers that do
      not parse, hundreds of headers or one of 100 KB, SSE events that are errors, huge,
      binary or unterminated, Content-Length and chunking that lie, resets, silence).
--admin-poll also serves the admin endpoint and reads its page, /metrics and
/compute/concurrency every 50 ms meanwhile (its threads beside the proxy's loop: worth a run
with a ThreadSanitizer build, --build build/tsan). Every 10 s a progress line. At the end the
proxy gets SIGTERM and must exit 0 within 20 s.
Exit status 0 when it did, with no sanitizer report on its stderr (leaks at exit included);
1 otherwise, with the report and the last inputs of each client thread under WORK (printed).
Found with it: the 431 after an answered request that read freed memory (see
proxy::a_head_too_large_after_an_answered_request_is_431_logged_as_no_requests).
"""
import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def mutated_request(r):
    """One client request, most of them wrong in one way."""
    head = [b'POST /v1/chat/completions HTTP/1.1', b'Host: x', b'Content-Type: application/json']
    body = CHAT if r.random() < 0.7 else CHAT.replace(b'true', b'false')
    length = True
    k = r.randrange(16)
    if k == 0:
        head += [b'Content-Length: %d' % len(body), b'Transfer-Encoding: chunked']
        length = False
    elif k in (1, 2):
        head.append(b'Transfer-Encoding: chunked')
        length = False
        chunks, i = [], 0
        while i < len(body):
            n = r.randint(1, 20)
            part, i = body[i:i + n], i + n
            size = b'%x' % len(part) if r.random() < 0.9 else r.choice(
                [b'zz', b'f' * 18, b'-1', b'', b'1;ext=' + b'a' * r.randint(0, 5000)])
            chunks.append(size + b'\r\n' + part + (b'\r\n' if r.random() < 0.95 else b'X'))
        chunks.append(b'0\r\n' + b'Trailer: x\r\n' * r.randint(0, 3) + b'\r\n')
        body = b''.join(chunks)
    elif k == 3:
        head.append(b'Content-Length: %d' % r.choice([0, len(body) - 3, 10**6, 2**64 - 1]))
        length = False
    elif k == 4:
        head.append(r.choice([b'X-Sluice-Deadline-Ms: ', b'X-Sluice-Start-Deadline-Ms: ']) +
                    r.choice([b'-1', b'0', b'1', b'30', b'1e3', b'abc', b'', b'99999999999']))
    elif k == 5:
        head[0] = r.choice([b'GET / HTTP/1.1', b'POST http://x/ HTTP/1.1', b'POST /v1 HTTP/2.0',
                            b'POST  /x HTTP/1.1', b'P\x00ST /x HTTP/1.1', b'POST /x HTTP/1.0',
                            b'POST /\x7f HTTP/1.1', b'HEAD /v1/chat/completions HTTP/1.1',
                            b'GET /v1/models HTTP/1.1', b'GET /v1/models HTTP/1.0'])
    elif k == 6:
        head.append(b'X' * r.randint(1, 4000) + b': y')
    elif k == 7:
        head.append(b' folded: continuation')
    elif k == 8:
        head.append(b'Expect: 100-continue')
    elif k == 9:
        head += [b'H%d: v' % i for i in range(r.randint(50, 200))]
    elif k == 10:
        head.append(b'Connection: close, keep-alive')
    elif k == 11:
        body = bytes(r.randrange(256) for _ in range(len(body)))
    elif k == 12:
        head += [b'Content-Length: %d' % len(body), b'Content-Length: %d' % (len(body) + 1)]
        length = False
    elif k == 13:
        head.append(b'Transfer-Encoding: gzip, chunked')
        length = False
    elif k == 14:
        body = b'{"model":"' + b'm' * r.randint(0, 3000) + b'","messages":[]}'
    if length:
        head.append(b'Content-Length: %d' % len(body))
    raw = b'\r\n'.join(head) + b'\r\n\r\n' + body
    if r.random() < 0.1:
        raw = bytearray(raw)
        for _ in range(r.randint(1, 4)):
            raw[r.randrange(len(raw))] = r.randrange(256)
        raw = bytes(raw)
    return raw


def sse_events(r):
    pick = [b': comment\n\n', b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n',
            b'event: error\ndata: {"error":{"message":"boom","type":"overloaded_error"}}\n\n',
            b'data: [DONE]\n\n', b'data: {"usage":{"prompt_tokens":1e999}}\n\n',
            b'data: {"error":{"message":5}}\n\n', b'\r\n\r\n\n\n\r', b'retry: 99999999999\nid: \x00\n\n']
    events = []
    for _ in range(r.randint(0, 8)):
        k = r.randrange(len(pick) + 3)
        if k < len(pick):
            events.append(pick[k])
        elif k == len(pick):
            events.append(b'data: ' + b'z' * r.randint(0, 70000) + b'\n\n')
        elif k == len(pick) + 1:
            events.append(b'event: ' + b'e' * r.randint(0, 5000) + b'\n')
        else:
            events.append(bytes(r.randrange(256) for _ in range(r.randint(1, 50))))
    return events


def mutated_response(r, stream):
    """(head, body pieces) of one upstream answer, most of them wrong in one way."""
    status = r.choice([b'200 OK'] * 6 + [b'429 Too Many Requests', b'503 Service Unavailable',
                                         b'529 Overloaded', b'500 X', b'400 B', b'100 Continue',
                                         b'999 Weird', b'200', b'20x OK'])
    head = []
    k = r.randrange(10)
    if k == 0:
        head.append(b'Retry-After: ' + r.choice([b'-5', b'9' * 17, b'Wed, 21 Oct 2015 07:28:00 GMT',
                                                  b'abc', b'', b'1.5']))
    elif k == 1:
        head += [b'x-ratelimit-limit-requests: ' + r.choice([b'0', b'-1', b'9' * 20, b'x']),
                 b'x-ratelimit-remaining-requests: ' + r.choice([b'0', b'-3']),
                 b'x-ratelimit-reset-requests: ' + r.choice([b'1s', b'-1s', b'1e9h', b'', b'2ms3'])]
    elif k == 2:
        head += [b'anthropic-ratelimit-requests-reset: ' + r.choice([b'garbage', b'9999-99-99T99:99:99Z']),
                 b'retry-after-ms: ' + r.choice([b'-1', b'1e20'])]
    elif k == 3:
        head += [b'X-H%d: %s' % (i, b'v' * r.randint(0, 100)) for i in range(r.randint(50, 300))]
    elif k == 4:
        head.append(b'X-Big: ' + b'b' * r.randint(10000, 120000))
    elif k == 5:
        head.append(b'x-request-id: ' + bytes(r.randrange(32, 127) for _ in range(r.randint(0, 400))))
    elif k == 6:
        head.append(b'Content-Encoding: gzip')
    if stream and r.random() < 0.7:
        head.append(b'Content-Type: text/event-stream')
        body = sse_events(r)
    else:
        head.append(b'Content-Type: application/json')
        body = [r.choice([b'{"choices":[{"message":{"content":"hi"}}]}', b'{', b'', b'null',
                          b'{"error":{"message":"x","code":"rate_limit_exceeded"}}'])]
    whole = b''.join(body)
    framing = r.randrange(5)
    if framing == 0:
        head.append(b'Content-Length: %d' % len(whole))
        pieces = body
    elif framing == 1:
        head.append(b'Transfer-Encoding: chunked')
        pieces = [b'%x\r\n' % len(p) + p + b'\r\n' for p in body if p] + [b'0\r\n\r\n']
        if r.random() < 0.2:
            pieces.insert(r.randrange(len(pieces) + 1), r.choice([b'zz\r\n', b'f' * 19 + b'\r\n']))
    elif framing == 2:
        head.append(b'Content-Length: %d' % (len(whole) + r.choice([-3, 5, 10**6])))
        pieces = body
    elif framing == 3:
        head.append(b'Connection: close')
        pieces = body
    else:
        head += [b'Content-Length: %d' % len(whole), b'Transfer-Encoding: chunked']
        pieces = body
    raw = b'HTTP/1.1 ' + status + b'\r\n' + b''.join(h + b'\r\n' for h in head) + b'\r\n'
    if r.random() < 0.05:
        raw = r.choice([b'HTTP/1.0 200 OK\r\n\r\n', b'garbage\r\n\r\n', b'HTTP/1.1 200 OK\n\n', b''])
    return raw, pieces


class HostileUpstream:
    """A loopback server answering every request with mutated_response."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                r = random.Random(self.rng.random())
            threading.Thread(target=self.serve, args=(conn, r), daemon=True).start()

    def serve(self, conn, r):
        conn.settimeout(5)
        buf = b''
        try:
            while True:
                while b'\r\n\r\n' not in buf:
                    more = conn.recv(65536)
                    if not more:
                        return
                    buf += more
                head, _, rest = buf.partition(b'\r\n\r\n')
                length = 0
                for line in head.split(b'\r\n'):
                    if line.lower().startswith(b'content-length:'):
                        length = int(line.split(b':')[1])
                while len(rest) < length:
                    more = conn.recv(65536)
                    if not more:
                        return
                    rest += more
                body, buf = rest[:length], rest[length:]
                fate = r.randrange(20)
                if fate == 0:
                    return  # closed without an answer
                if fate == 1:
                    time.sleep(r.choice([0.5, 1.5]))  # silent, then gone
                    return
                raw, pieces = mutated_response(r, b'"stream":true' in body)
                conn.sendall(raw)
                for piece in pieces:
                    if r.random() < 0.3:
                        time.sleep(r.choice([0.001, 0.02, 0.2]))
                    if r.random() < 0.03:  # a reset mid-answer
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b'\1\0\0\0\0\0\0\0')
                        return
                    conn.sendall(piece)
                if b'close' in raw.lower() or r.random() < 0.2:
                    return
        except OSError:
            pass
        finally:
            conn.close()


def hostile_client(port, r, deadline, last, stop):
    """--side clients: mutated requests, pipelined, cut, then read, dropped or reset."""
    while time.time() < deadline and not stop.is_set():
        data = b''.join(mutated_request(r) for _ in range(r.randint(1, 3)))
        last.append(data)
        del last[:-3]
        try:
            s = socket.create_connection(('127.0.0.1', port), timeout=2)
        except OSError:
            time.sleep(0.05)
            continue
        try:
            i = 0
            while i < len(data):
                j = i + r.randint(1, len(data))
                s.sendall(data[i:j])
                i = j
                if r.random() < 0.05:
                    time.sleep(r.choice([0.001, 0.01, 0.05, 0.35]))
            end_with(s, r, r.randrange(4))
        except OSError:
            pass
        finally:
            s.close()
        yield


def chat_client(port, r, deadline, last, stop):
    """--side upstream: plain and streamed chats on kept-alive connections."""
    while time.time() < deadline and not stop.is_set():
        try:
            s = socket.create_connection(('127.0.0.1', port), timeout=3)
            for _ in range(r.randint(1, 4)):
                body = CHAT if r.random() < 0.6 else CHAT.replace(b'true', b'false')
                raw = (b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n'
                       % len(body) + body)
                last.append(raw)
                del last[:-3]
                s.sendall(raw)
                if r.random() < 0.25:
                    s.recv(r.randint(1, 300))  # a client that stops: the answer is read on
                    break
                if not read_answer(s):
                    break
            s.close()
        except OSError:
            pass
        yield


def poll_admin(port, deadline, stop):
    while time.time() < deadline and not stop.is_set():
        for path in (b'/', b'/metrics', b'/compute/concurrency'):
            try:
                s = socket.create_connection(('127.0.0.1', port), timeout=2)
                s.sendall(b'GET ' + path + b' HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
                while s.recv(65536):
                    pass
                s.close()
            except OSError:
                pass
        time.sleep(0.05)


def end_with(s, r, how):
    if how == 1:
        s.recv(r.randint(1, 400))
    elif how == 2:  # a reset
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b'\1\0\0\0\0\0\0\0')
    elif how == 3:
        s.settimeout(1)
        while s.recv(65536):
            pass


def read_answer(s):
    """Read one answer to its end (Content-Length or the last chunk); False at a close."""
    got = b''
    while b'\r\n\r\n' not in got:
        more = s.recv(65536)
        if not more:
            return False
        got += more
    head, _, body = got.partition(b'\r\n\r\n')
    lower = head.lower()
    if b'content-length:' in lower:
        n = int(lower.split(b'content-length:')[1].split(b'\r\n')[0])
        while len(body) < n:
            more = s.recv(65536)
            if not more:
                return False
            body += more
        return True
    while not body.endswith(b'0\r\n\r\n'):
        more = s.recv(65536)
        if not more:
            return False
        body += more
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', required=True, help='a build directory (the asan preset\'s)')
    ap.add_argument('--side', choices=('clients', 'upstream'), default='clients')
    ap.add_argument('--seconds', type=float, default=300)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--threads', type=int, default=4)
    ap.add_argument('--admin-poll', action='store_true')
    ap.add_argument('--proxy-arg', action='append', default=[])
    opts = ap.parse_args()
    proxy_bin = os.path.join(opts.build, 'shim', 'sluice-proxy')
    if not os.access(proxy_bin, os.X_OK):
        sys.exit('proxy_blackbox: no %s: build sluice-proxy there first '
                 '(cmake --preset asan && cmake --build build/asan --target sluice-proxy '
                 'sluice-provider-sim)' % proxy_bin)
    work = tempfile.mkdtemp(prefix='proxy-blackbox-')
    sim = None
    if opts.side == 'clients':
        sim = subprocess.Popen([os.path.join(opts.build, 'shim', 'sluice-provider-sim'), '--stream',
                                '--median-ms', '5', '--cap', '4', '--token-ms', '2',
                                '--answer-tokens', '5'], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
        upstream_port = int(sim.stdout.readline())
        limits = ['--client-timeout-ms', '300', '--max-body-bytes', '4096',
                  '--max-header-bytes', '2048', '--max-connections', '64']
    else:
        upstream_port = HostileUpstream(opts.seed).port
        limits = ['--upstream-idle-ms', '300', '--client-timeout-ms', '2000']
    stderr_path = os.path.join(work, 'proxy.stderr')
    env = dict(os.environ, ASAN_OPTIONS='detect_leaks=1:halt_on_error=1',
               UBSAN_OPTIONS='halt_on_error=1:print_stacktrace=1')
    proxy = subprocess.Popen([proxy_bin, '--upstream', 'http://127.0.0.1:%d' % upstream_port,
                              '--listen', '127.0.0.1:0', '--admin',
                              '127.0.0.1:0' if opts.admin_poll else 'off', '--state', 'off',
                              '--access-log', 'off'] + limits + opts.proxy_arg,
                             stdout=subprocess.PIPE, stderr=open(stderr_path, 'w'), env=env)
    port = int(proxy.stdout.readline().decode().rsplit(':', 1)[1])
    deadline, stop = time.time() + opts.seconds, threading.Event()
    if opts.admin_poll:
        admin_port = int(proxy.stdout.readline().decode().rsplit(':', 1)[1])
        threading.Thread(target=poll_admin, args=(admin_port, deadline, stop), daemon=True).start()
    drive = hostile_client if opts.side == 'clients' else chat_client
    lasts, counts = [[] for _ in range(opts.threads)], [0] * opts.threads

    def worker(k):
        for _ in drive(port, random.Random(opts.seed * 1000 + k), deadline, lasts[k], stop):
            counts[k] += 1
            if proxy.poll() is not None:
                stop.set()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(opts.threads)]
    for t in threads:
        t.start()
    began = shown = time.time()
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.time() - shown >= 10:
            shown = time.time()
            print('proxy_blackbox: %s side, %.0f s, %d connections, proxy %s' %
                  (opts.side, shown - began, sum(counts),
                   'running' if proxy.poll() is None else 'exited %d' % proxy.returncode),
                  flush=True)
    alive = proxy.poll() is None
    if alive:
        proxy.terminate()
        try:
            proxy.wait(20)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
    if sim:
        sim.terminate()
    report = open(stderr_path, errors='replace').read()
    bad = any(word in report for word in ('AddressSanitizer', 'LeakSanitizer', 'ThreadSanitizer',
                                          'runtime error'))
    if not alive or bad or proxy.returncode != 0:
        inputs = os.path.join(work, 'last-inputs.txt')
        with open(inputs, 'w') as f:
            for k, last in enumerate(lasts):
                for data in last:
                    f.write('thread %d: %r\n' % (k, data))
        print(report[-6000:])
        print('proxy_blackbox: FAILED (%s; exit %s); its stderr %s, the last inputs %s' %
              ('died during the run' if not alive else 'a sanitizer report' if bad
               else 'a bad exit', proxy.returncode, stderr_path, inputs))
        return 1
    shutil.rmtree(work)
    print('proxy_blackbox: no report, exit 0 after SIGTERM (%d connections)' % sum(counts))
    return 0


if __name__ == '__main__':
    sys.exit(main())
