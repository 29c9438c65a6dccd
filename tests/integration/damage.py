#!/usr/bin/python3
"""damage.py - damaged variants of a small valid GGUF, for test_damaged.sh.

usage: damage.py SRC.gguf OUTDIR

Writes OUTDIR/CASE.gguf for every case below and OUTDIR/cases.tsv with one
line per case: "CASE<TAB>RC<TAB>REGEX", where RC is the exit status ecs-run
must give ("0" or "fail") and REGEX a pattern its stderr must contain (the
specific error or warning of that class of damage). Each case changes one
thing in an otherwise valid model; the parser (gguf_inspect.py) and writer
here are independent of the project's C reader.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_inspect  # noqa: E402

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
          7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# ggml type id -> (block elements, block bytes), for the tensor sizes
BLOCKS = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 14: (256, 210),
          6: (32, 22), 30: (1, 2)}


class Model:
    """Metadata as [key, type, value] with value decoded (arrays: (elem
    type, list)), tensors as dicts with their bytes, and the data section;
    parsed by gguf_inspect.parse (independent of the project's C reader)."""

    def __init__(self, path):
        g = gguf_inspect.parse(path)
        self.version = g["version"]
        self.kvs = [[k, t, decode(t, v)] for k, t, v in g["kvs"]]
        self.data = bytearray(g["buf"][g["data_start"]:])
        self.tensors = [{"name": n, "ne": ne, "type": tt, "offset": off}
                        for n, ne, tt, off in g["tensors"]]
        for t in self.tensors:
            t["data"] = bytes(self.data[t["offset"]:t["offset"] + nbytes(t)])

    def get(self, key, default=None):
        for k, _, v in self.kvs:
            if k == key:
                return v
        return default

    def set(self, key, t, v):
        for kv in self.kvs:
            if kv[0] == key:
                kv[1], kv[2] = t, v
                return
        self.kvs.append([key, t, v])

    def drop(self, key):
        self.kvs = [kv for kv in self.kvs if kv[0] != key]

    def tensor(self, name):
        return next(t for t in self.tensors if t["name"] == name)

    def write(self, path, align=None, relayout=True):
        """Writes the file; relayout places every tensor's data anew (in
        list order, aligned); otherwise the offsets and data section are
        kept as they are (for overlapping tensors)."""
        if align is not None:
            self.set("general.alignment", 4, align)
        align = self.get("general.alignment", 32)
        if relayout:
            data, off = bytearray(), 0
            for t in self.tensors:
                data += b"\0" * (off - len(data))
                t["offset"] = off
                data += t["data"]
                off = (len(data) + align - 1) // align * align
            self.data = data
        out = bytearray(struct.pack("<IIQQ", 0x46554747, self.version, len(self.tensors),
                                    len(self.kvs)))
        for k, t, v in self.kvs:
            out += enc_str(k) + struct.pack("<I", t) + enc_value(t, v)
        for t in self.tensors:
            out += enc_str(t["name"]) + struct.pack("<I", len(t["ne"]))
            out += b"".join(struct.pack("<Q", n) for n in t["ne"])
            out += struct.pack("<IQ", t["type"], t["offset"])
        out += b"\0" * ((-len(out)) % align)
        open(path, "wb").write(bytes(out) + bytes(self.data))


def decode(t, v):
    if t == STRING:
        return v.decode("utf-8", "surrogateescape")
    if t == ARRAY:
        _, et, n, items = v
        if et == STRING:
            return (et, [x.decode("utf-8", "surrogateescape") for x in items])
        if et in SCALAR:
            return (et, list(struct.unpack("<%d%s" % (n, SCALAR[et][1:]), items)))
        raise ValueError("nested arrays are not needed here")
    return v


def nbytes(t):
    n = 1
    for d in t["ne"]:
        n *= d
    be, bb = BLOCKS[t["type"]]
    return n // be * bb


def enc_str(s):
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def enc_value(t, v):
    if t == STRING:
        return enc_str(v)
    if t == ARRAY:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(enc_value(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def cases(src):
    """(name, rc, regex, change) per case; change(model) edits a fresh copy
    and returns write()'s keyword arguments."""
    arch = Model(src).get("general.architecture")
    k = lambda s: arch + "." + s  # noqa: E731
    n_layer = Model(src).get(k("block_count"))
    last = "blk.%d." % (n_layer - 1)

    def overlap(m):  # two tensors of the same size share their bytes
        a, b = m.tensor("blk.0.attn_norm.weight"), m.tensor("blk.0.ffn_norm.weight")
        b["offset"] = a["offset"]
        return {"relayout": False}

    def inf_scale(m):  # a Q8_0 block scale of inf in layer 1's attention output
        t = m.tensor("blk.1.attn_output.weight")
        d = bytearray(t["data"])
        for i in range(0, len(d), 34):
            d[i:i + 2] = struct.pack("<H", 0x7C00)
        t["data"] = bytes(d)
        return {}

    def bad_type(m):
        et, v = m.get("tokenizer.ggml.token_type")
        v = list(v)
        v[7] = 99
        m.set("tokenizer.ggml.token_type", ARRAY, (et, v))
        return {}

    def garbage_merges(m):
        et, v = m.get("tokenizer.ggml.merges")
        m.set("tokenizer.ggml.merges", ARRAY,
              (et, ["q%dz x%dj" % (i, i * 7) for i in range(len(v))]))
        return {}

    def setk(key, t, v):
        def f(m):
            m.set(key, t, v)
            return {}
        return f

    def dropk(key):
        def f(m):
            m.drop(key)
            return {}
        return f

    out = [
        # 2: plausible but inconsistent
        ("overlap", "fail", r"overlap", overlap),
        ("block_count_low", "0", r"warning: .*not used.*" + last.replace(".", r"\."),
         setk(k("block_count"), 4, n_layer - 1)),
        ("rms_eps_huge", "fail", r"layer_norm_rms_epsilon.*out of range",
         setk(k("attention.layer_norm_rms_epsilon"), 6, 1e30)),
        ("rms_eps_negative", "fail", r"layer_norm_rms_epsilon.*out of range",
         setk(k("attention.layer_norm_rms_epsilon"), 6, -1e-6)),
        ("rope_base_huge", "fail", r"rope\.freq_base.*out of range",
         setk(k("rope.freq_base"), 6, 1e30)),
        ("token_type", "fail", r"token_type.*token 7.*99", bad_type),
        ("merges_empty", "fail", r"merges.*empty", setk("tokenizer.ggml.merges", ARRAY, (STRING, []))),
        ("merges_garbage", "fail", r"merges.*not tokens", garbage_merges),
        ("ctx_zero", "fail", r"context_length.*0", setk(k("context_length"), 4, 0)),
        # 3: non-finite activations
        ("inf_weight", "fail", r"non-finite.*layer 1.*model file", inf_scale),
        # 4: errors that wrap errors name the key and keep the reason
        ("key_wrong_type", "fail",
         r"metadata %s: .*has type string, expected" % k("block_count").replace(".", r"\."),
         setk(k("block_count"), STRING, "four")),
        ("key_missing", "fail", r"missing metadata key '%s'" % k("block_count").replace(".", r"\."),
         dropk(k("block_count"))),
        # 5: undefined behaviour (UBSan) on huge shapes and byte alignment
        ("ff_exp_huge", "fail", r"expert_feed_forward_length", setk(k("expert_feed_forward_length"), 4, 1 << 30)),
        ("align1", "0", r"", lambda m: {"align": 1}),
    ]
    if arch == "deepseek2":
        out.append(("weights_scale_huge", "fail", r"expert_weights_scale.*out of range",
                    setk(k("expert_weights_scale"), 6, 1e30)))
    else:  # metadata only in qwen3moe: named when absurd, else not sizing the workspace
        out.append(("ff_metadata_huge", "fail", r"feed_forward_length = 1073741824 is out of range",
                    setk(k("feed_forward_length"), 4, 1 << 30)))
        out.append(("ff_metadata_big", "0", r"", setk(k("feed_forward_length"), 4, 1 << 20)))
    return out


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    src, outdir = argv[1], argv[2]
    with open(outdir + "/cases.tsv", "w") as tsv:
        for name, rc, regex, change in cases(src):
            m = Model(src)
            kw = change(m)
            m.write("%s/%s.gguf" % (outdir, name), **kw)
            tsv.write("%s\t%s\t%s\n" % (name, rc, regex))


if __name__ == "__main__":
    main(sys.argv)
