#!/usr/bin/python3
"""gguf_inspect.py - an independent GGUF header parser for the integration tests.

It does not use the project's C reader, so that a bug shared by the writer and
the reader cannot hide itself. Subcommands:

  dump FILE            print every key (type, value or array summary) and every
                       tensor (name, ne, type, offset) in file order
  compare A B [--ignore KEY ...]
                       exit 1 unless A and B have the same keys in the same
                       order with the same types and values (arrays compared
                       by content hash), and the same set of tensors with the
                       same ne and type (tensor order is free: llama-quantize
                       reorders)
  get FILE KEY         print one scalar value (arrays: a summary)
  elem FILE KEY I      print element I of an array value
  tensors FILE         print "name type ne0xne1x..." per tensor, sorted
  check FILE           verify data-section layout: offsets aligned, in order,
                       non-overlapping, sizes match the type, file size exact
  bytes-by-type FILE   bytes and percentage per tensor type
  qstats FILE NAME     dequantize tensor NAME (F32/Q8_0 only) and print
                       mean and std
"""
import hashlib
import mmap
import struct
import sys

import numpy as np

GGUF_TYPES = {
    0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32",
    6: "FLOAT32", 7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64",
    12: "FLOAT64",
}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
              7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (name, block elements, block bytes)
TENSOR_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    30: ("BF16", 1, 2),
}


class Reader:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n])
        if len(s) != n:
            raise ValueError("string runs past end of file")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et = self.take("<I")
            n = self.take("<Q")
            if et in SCALAR_FMT:
                size = struct.calcsize(SCALAR_FMT[et])
                raw = bytes(self.buf[self.pos:self.pos + n * size])
                self.pos += n * size
                return ("ARRAY", et, n, raw)
            items = [self.value(et) for _ in range(n)]
            return ("ARRAY", et, n, items)
        return self.take(SCALAR_FMT[t])


def parse(path):
    # mapped, not read: headers of multi-GB models are inspected too
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = Reader(buf)
    if r.take("<I") != 0x46554747:
        raise ValueError(f"{path}: not a GGUF file")
    version = r.take("<I")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string().decode()
        t = r.take("<I")
        kvs.append((key, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string().decode()
        nd = r.take("<I")
        ne = [r.take("<Q") for _ in range(nd)]
        tt = r.take("<I")
        off = r.take("<Q")
        tensors.append((name, ne, tt, off))
    align = 32
    for key, t, v in kvs:
        if key == "general.alignment":
            align = v
    data_start = (r.pos + align - 1) // align * align
    return {"version": version, "kvs": kvs, "tensors": tensors, "align": align,
            "data_start": data_start, "header_end": r.pos, "size": len(buf), "buf": buf}


def array_desc(t, v):
    _, et, n, content = v
    h = hashlib.sha256()
    if isinstance(content, bytes):
        h.update(content)
    else:
        for item in content:
            h.update(struct.pack("<Q", len(item)) + item if isinstance(item, bytes)
                     else repr(item).encode())
    return f"[{GGUF_TYPES.get(et, et)}] x{n} sha256:{h.hexdigest()[:16]}"


def value_desc(t, v):
    if t == 9:
        return array_desc(t, v)
    if t == 8:
        return repr(v.decode(errors="replace"))
    if t == 6:
        return repr(float(np.float32(v)))
    return repr(v)


def tensor_nbytes(ne, tt):
    name, blk, size = TENSOR_TYPES[tt]
    n = 1
    for d in ne:
        n *= d
    if ne[0] % blk:
        raise ValueError(f"row {ne[0]} not a multiple of {name} block {blk}")
    return n // blk * size


def cmd_dump(path):
    g = parse(path)
    print(f"version {g['version']} alignment {g['align']} size {g['size']}")
    for key, t, v in g["kvs"]:
        print(f"kv {key} {GGUF_TYPES[t]} {value_desc(t, v)}")
    for name, ne, tt, off in g["tensors"]:
        print(f"tensor {name} {TENSOR_TYPES[tt][0]} {'x'.join(map(str, ne))} @{off}")
    return 0


def cmd_compare(a, b, ignore):
    ga, gb = parse(a), parse(b)
    bad = 0

    def kvlist(g):
        return [(k, GGUF_TYPES[t], value_desc(t, v)) for k, t, v in g["kvs"] if k not in ignore]

    ka, kb = kvlist(ga), kvlist(gb)
    if [k for k, _, _ in ka] != [k for k, _, _ in kb]:
        print(f"key order/set differs:\n  {a}: {[k for k, _, _ in ka]}\n  {b}: {[k for k, _, _ in kb]}")
        bad += 1
    da, db = {k: (t, v) for k, t, v in ka}, {k: (t, v) for k, t, v in kb}
    for k in sorted(set(da) | set(db)):
        if da.get(k) != db.get(k):
            print(f"key {k}: {da.get(k)} != {db.get(k)}")
            bad += 1
    ta = {n: (ne, TENSOR_TYPES[tt][0]) for n, ne, tt, _ in ga["tensors"]}
    tb = {n: (ne, TENSOR_TYPES[tt][0]) for n, ne, tt, _ in gb["tensors"]}
    for n in sorted(set(ta) | set(tb)):
        if ta.get(n) != tb.get(n):
            print(f"tensor {n}: {ta.get(n)} != {tb.get(n)}")
            bad += 1
    if ga["version"] != gb["version"] or ga["align"] != gb["align"]:
        print("version/alignment differ")
        bad += 1
    print(f"{bad} differences ({len(ka)} keys, {len(ta)} tensors)")
    return 1 if bad else 0


def cmd_get(path, key):
    for k, t, v in parse(path)["kvs"]:
        if k == key:
            print(v.decode() if t == 8 else (array_desc(t, v) if t == 9 else v))
            return 0
    print(f"{key}: not found", file=sys.stderr)
    return 1


def cmd_elem(path, key, i):
    for k, t, v in parse(path)["kvs"]:
        if k == key and t == 9:
            item = v[3][i] if not isinstance(v[3], bytes) else \
                struct.unpack_from(SCALAR_FMT[v[1]], v[3], i * struct.calcsize(SCALAR_FMT[v[1]]))[0]
            print(item.decode(errors="replace") if isinstance(item, bytes) else item)
            return 0
    print(f"{key}: no such array", file=sys.stderr)
    return 1


def cmd_tensors(path):
    for name, ne, tt, _ in sorted(parse(path)["tensors"]):
        print(f"{name} {TENSOR_TYPES[tt][0]} {'x'.join(map(str, ne))}")
    return 0


def cmd_check(path):
    g = parse(path)
    end = 0
    for name, ne, tt, off in g["tensors"]:
        nb = tensor_nbytes(ne, tt)
        if off % g["align"] or off < end:
            print(f"{name}: offset {off} misaligned or overlapping (prev end {end})")
            return 1
        end = off + nb
    if not g["tensors"]:
        ok = g["header_end"] <= g["size"] <= g["data_start"]
        print(f"{'ok' if ok else 'bad'}: no tensors, {g['size']} bytes")
        return 0 if ok else 1
    # ggml pads after every tensor, the last one included
    want = g["data_start"] + (end + g["align"] - 1) // g["align"] * g["align"]
    if g["size"] != want:
        print(f"file size {g['size']} != data start {g['data_start']} + padded {end}")
        return 1
    print(f"ok: {len(g['tensors'])} tensors, {g['size']} bytes")
    return 0


def cmd_bytes_by_type(path):
    g = parse(path)
    tot = {}
    for _, ne, tt, _ in g["tensors"]:
        n = TENSOR_TYPES[tt][0]
        tot[n] = tot.get(n, 0) + tensor_nbytes(ne, tt)
    s = sum(tot.values())
    for n, b in sorted(tot.items(), key=lambda x: -x[1]):
        print(f"{n} {b} {100.0 * b / s:.1f}%")
    return 0


def tensor_values(g, name):
    for n, ne, tt, off in g["tensors"]:
        if n != name:
            continue
        start = g["data_start"] + off
        raw = g["buf"][start:start + tensor_nbytes(ne, tt)]
        if tt == 0:
            return np.frombuffer(raw, dtype="<f4")
        if tt == 8:
            blk = np.frombuffer(raw, dtype=[("d", "<f2"), ("qs", "i1", 32)])
            return (blk["d"].astype(np.float32)[:, None] * blk["qs"].astype(np.float32)).ravel()
        raise ValueError(f"{name}: type {TENSOR_TYPES[tt][0]} not supported by qstats")
    raise ValueError(f"{name}: no such tensor")


def cmd_qstats(path, name):
    x = tensor_values(parse(path), name)
    print(f"{x.size} {float(x.mean()):.6f} {float(x.std()):.6f}")
    return 0


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[1]
    if cmd == "dump":
        return cmd_dump(argv[2])
    if cmd == "compare":
        ignore = set()
        rest = argv[4:]
        while rest:
            if rest[0] == "--ignore" and len(rest) > 1:
                ignore.add(rest[1])
                rest = rest[2:]
            else:
                print(f"bad argument {rest[0]}", file=sys.stderr)
                return 2
        return cmd_compare(argv[2], argv[3], ignore)
    if cmd == "get" and len(argv) == 4:
        return cmd_get(argv[2], argv[3])
    if cmd == "elem" and len(argv) == 5:
        return cmd_elem(argv[2], argv[3], int(argv[4]))
    if cmd == "tensors":
        return cmd_tensors(argv[2])
    if cmd == "check":
        return cmd_check(argv[2])
    if cmd == "bytes-by-type":
        return cmd_bytes_by_type(argv[2])
    if cmd == "qstats" and len(argv) == 4:
        return cmd_qstats(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
