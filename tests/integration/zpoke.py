#!/usr/bin/env python3
"""zpoke.py - throws bad messages at a daemon's ZeroMQ socket and checks that
it keeps answering.

  zpoke.py control|data ENDPOINT
  zpoke.py threads ENDPOINT N


Sends random frames, truncated and oversized headers, a wrong magic, a wrong
protocol version, an unknown kind, set flag bits, a body that is not a
protobuf, a data message without its payload frame, and a peer that connects
and says nothing. Exit 0 when the daemon answered the last probe (a
well-framed message with a garbage body must get an Error back), so it is
still serving; prints one summary line.

`threads` sends one well-formed ExpertCall asking for N threads
(ExpertCall.threads) and prints the Result's status and message (exit 0 when
a Result came back)."""
import os
import random
import struct
import sys

import zmq

MAGIC = 0x50534345
KIND_HELLO, KIND_ERROR, KIND_CALL = 1, 7, 9


def header(kind, length, version=1, flags=0, magic=MAGIC):
    return struct.pack("<IHBBI", magic, version, kind, flags, length)


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def field(num, v):
    return varint(num << 3) + varint(v)


def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def call_threads(ep, n):
    """One call of 1 f32 row of 4 values, expert 0, slot 0 of k 1, asking
    for n threads; prints 'status S: message'."""
    body = (field(1, 1) + field(2, 0) + field(3, 1) + field(4, 4) + field(5, 0) + field(6, 1)
            + field(7, 0) + field(8, 1) + field(9, 0) + field(10, 0) + field(12, 16)
            + field(13, 0) + field(14, n))
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    s.send_multipart([header(KIND_CALL, len(body)) + body, b"\0" * 16])
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    got = s.recv_multipart() if dict(poller.poll(5000)) else None
    s.close(0)
    ctx.term()
    if not got:
        print("no answer")
        return 1
    b, i, status, msg = got[0][12:], 0, 0, ""
    while i < len(b):
        key, i = read_varint(b, i)
        if key & 7 == 2:
            ln, i = read_varint(b, i)
            if key >> 3 == 8:
                msg = b[i:i + ln].decode()
            i += ln
        else:
            v, i = read_varint(b, i)
            if key >> 3 == 2:
                status = v
    print(f"status {status}: {msg}")
    return 0


def main():
    role, ep = sys.argv[1], sys.argv[2]
    if role == "threads":
        return call_threads(ep, int(sys.argv[3]))
    ctx = zmq.Context()
    # a peer that connects and says nothing
    silent = ctx.socket(zmq.DEALER)
    silent.connect(ep)
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    rnd = random.Random(1)
    kind = KIND_CALL if role == "data" else KIND_HELLO
    body = bytes(rnd.randrange(256) for _ in range(40))
    probes = [
        [bytes(rnd.randrange(256) for _ in range(n))] for n in (0, 1, 11, 12, 13, 300)
    ] + [
        [header(kind, 40)[:7]],                                  # truncated header
        [header(kind, 1 << 30) + body],                          # length beyond the frame
        [header(kind, 40, magic=0x12345678) + body],             # wrong magic
        [header(kind, 40, version=999) + body],                  # unknown version
        [header(200, 40) + body],                                # unknown kind
        [header(kind, 40, flags=0x80) + body],                   # reserved flag bits
        [header(kind, 40) + body, b"x" * 64, b"extra"],          # too many frames
        [header(KIND_CALL, 40) + body],                          # data kind without payload
        [header(kind, 40) + body] + ([b"\0" * 64] if role == "data" else []),
    ]
    for frames in probes:
        s.send_multipart(frames)
    answers = 0
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    while dict(poller.poll(300)):
        s.recv_multipart()
        answers += 1
    # the last probe: well framed, garbage body; must be answered with an Error
    s.send_multipart([header(kind, 40) + body] + ([b"\0" * 64] if role == "data" else []))
    last = None
    if dict(poller.poll(3000)):
        last = s.recv_multipart()
    silent.close(0)
    s.close(0)
    ctx.term()
    if not last or len(last[0]) < 12:
        print(f"no answer to the final probe after {len(probes)} bad messages ({answers} answered)")
        return 1
    magic, ver, k, flags, n = struct.unpack("<IHBBI", last[0][:12])
    if magic != MAGIC or k not in (KIND_ERROR, 10):
        print(f"final answer is not an Error/Result: magic {magic:#x} kind {k}")
        return 1
    print(f"{len(probes)} bad messages, {answers} answered, still answering (kind {k})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
