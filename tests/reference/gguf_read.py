"""gguf_read.py - a small, independent GGUF reader for the reference forward.

Written from the public GGUF format description (v2/v3: header, typed
key/value metadata, tensor infos, aligned data section), with numpy only, so
that the reference shares no code with the C runtime it checks. Tensor data
is memory-mapped; dequantization covers the plain block formats the reference
needs (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
"""

import numpy as np

GGUF_MAGIC = b"GGUF"

# metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

_SCALAR = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2",
    T_UINT32: "<u4", T_INT32: "<i4", T_FLOAT32: "<f4", T_BOOL: "<u1",
    T_UINT64: "<u8", T_INT64: "<i8", T_FLOAT64: "<f8",
}

# ggml tensor types: id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    30: ("BF16", 1, 2),
}

MAX_DIMS = 4
MAX_STRING = 1 << 24
MAX_COUNT = 1 << 32

class GGUFError(Exception):
    pass

class TensorInfo:
    def __init__(self, name, ne, type_id, offset):
        self.name = name
        self.ne = tuple(ne)                      # ggml order: ne[0] is the row length
        self.type_id = type_id
        self.offset = offset                     # relative to the data section
        tname, blk, bsize = GGML_TYPES[type_id]
        self.type_name = tname
        if self.ne[0] % blk:
            raise GGUFError(f"tensor {name}: row length {self.ne[0]} is not a multiple of "
                            f"the {tname} block size {blk}")
        self.row_bytes = self.ne[0] // blk * bsize
        self.n_rows = int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1
        self.nbytes = self.row_bytes * self.n_rows

    @property
    def shape(self):
        """numpy shape (reversed ggml ne)."""
        return tuple(reversed(self.ne))

class GGUFReader:
    def __init__(self, path):
        self.path = path
        self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        self.pos = 0
        if bytes(self._take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        self.version = self._scalar(T_UINT32)
        if self.version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {self.version} not supported (2 or 3)")
        n_tensors = self._scalar(T_UINT64)
        n_kv = self._scalar(T_UINT64)
        if n_tensors > len(self.buf) or n_kv > len(self.buf):
            raise GGUFError(f"{path}: implausible counts {n_tensors} tensors, {n_kv} keys")
        self.kv = {}
        self.kv_type = {}
        for _ in range(n_kv):
            key = self._string()
            vtype = self._scalar(T_UINT32)
            if key in self.kv:
                raise GGUFError(f"{path}: duplicate key {key}")
            self.kv[key] = self._value(vtype)
            self.kv_type[key] = vtype
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar(T_UINT32)
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"tensor {name}: {n_dims} dimensions")
            ne = [self._scalar(T_UINT64) for _ in range(n_dims)]
            type_id = self._scalar(T_UINT32)
            offset = self._scalar(T_UINT64)
            if type_id not in GGML_TYPES:
                raise GGUFError(f"tensor {name}: unknown ggml type {type_id}")
            if name in self.tensors:
                raise GGUFError(f"{path}: duplicate tensor {name}")
            self.tensors[name] = TensorInfo(name, ne, type_id, offset)
        align = int(self.kv.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise GGUFError(f"{path}: alignment {align} is not a power of two")
        self.alignment = align
        self.data_start = (self.pos + align - 1) // align * align
        for t in self.tensors.values():
            if t.offset % align:
                raise GGUFError(f"tensor {t.name}: offset {t.offset} not aligned to {align}")
            if self.data_start + t.offset + t.nbytes > len(self.buf):
                raise GGUFError(f"tensor {t.name}: data runs past the end of the file")

    # ---- header parsing ----

    def _take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated at offset {self.pos} (need {n} bytes)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _scalar(self, vtype):
        dt = np.dtype(_SCALAR[vtype])
        v = self._take(dt.itemsize).view(dt)[0]
        if vtype == T_BOOL:
            return bool(v)
        return v.item()

    def _string(self):
        n = self._scalar(T_UINT64)
        if n > MAX_STRING:
            raise GGUFError(f"{self.path}: string of {n} bytes at offset {self.pos}")
        return bytes(self._take(n)).decode("utf-8", errors="surrogateescape")

    def _value(self, vtype):
        if vtype in _SCALAR:
            return self._scalar(vtype)
        if vtype == T_STRING:
            return self._string()
        if vtype == T_ARRAY:
            etype = self._scalar(T_UINT32)
            n = self._scalar(T_UINT64)
            if n > MAX_COUNT:
                raise GGUFError(f"{self.path}: array of {n} elements")
            if etype in _SCALAR:
                dt = np.dtype(_SCALAR[etype])
                arr = np.array(self._take(n * dt.itemsize).view(dt))
                return arr.astype(bool) if etype == T_BOOL else arr
            if etype in (T_STRING, T_ARRAY):
                return [self._value(etype) for _ in range(n)]
            raise GGUFError(f"{self.path}: unknown array element type {etype}")
        raise GGUFError(f"{self.path}: unknown value type {vtype} at offset {self.pos}")

    # ---- tensor data ----

    def info(self, name):
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor {name}")
        return self.tensors[name]

    def raw_rows(self, name, start=0, stop=None):
        """Bytes of rows [start, stop) as a (rows, row_bytes) uint8 view."""
        t = self.info(name)
        stop = t.n_rows if stop is None else stop
        if not 0 <= start <= stop <= t.n_rows:
            raise GGUFError(f"tensor {name}: rows [{start}, {stop}) out of range {t.n_rows}")
        base = self.data_start + t.offset + start * t.row_bytes
        return self.buf[base:base + (stop - start) * t.row_bytes].reshape(stop - start,
                                                                          t.row_bytes)

    def rows(self, name, start=0, stop=None, dtype=np.float64):
        """Rows [start, stop) of the tensor seen as (n_rows, ne[0]), dequantized."""
        t = self.info(name)
        raw = self.raw_rows(name, start, stop)
        return dequantize(raw, t.type_name, t.ne[0]).astype(dtype, copy=False)

    def tensor(self, name, dtype=np.float64):
        """The whole tensor, dequantized, in numpy shape (reversed ne)."""
        t = self.info(name)
        return self.rows(name, dtype=dtype).reshape(t.shape)

    def get(self, key, default=None):
        return self.kv.get(key, default)

# ---- dequantization (block layouts of ggml's public format description) ----

def _f16(raw, col):
    return raw[:, col:col + 2].copy().view("<f2").astype(np.float32)

def _blocks(raw, bsize):
    nb = raw.shape[1] // bsize
    return raw.reshape(raw.shape[0] * nb, bsize)

def _nibbles(qs):
    """16 packed bytes -> 32 values: low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)

def _high_bits(qh_bytes):
    """4 bytes little-endian -> bit j for element j (0..31)."""
    qh = qh_bytes.copy().view("<u4")
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)

def dequantize(raw, type_name, row_len):
    rows = raw.shape[0]
    if type_name == "F32":
        return raw.copy().view("<f4").reshape(rows, row_len)
    if type_name == "F16":
        return raw.copy().view("<f2").astype(np.float32).reshape(rows, row_len)
    if type_name == "BF16":
        u = raw.copy().view("<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(rows, row_len)
    if type_name == "Q8_0":
        b = _blocks(raw, 34)
        d = _f16(b, 0)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, row_len)
    if type_name == "Q4_0":
        b = _blocks(raw, 18)
        d = _f16(b, 0)
        q = _nibbles(b[:, 2:]).astype(np.float32) - 8.0
        return (d * q).reshape(rows, row_len)
    if type_name == "Q4_1":
        b = _blocks(raw, 20)
        d, m = _f16(b, 0), _f16(b, 2)
        q = _nibbles(b[:, 4:]).astype(np.float32)
        return (d * q + m).reshape(rows, row_len)
    if type_name == "Q5_0":
        b = _blocks(raw, 22)
        d = _f16(b, 0)
        q = (_nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4)).astype(np.float32) - 16.0
        return (d * q).reshape(rows, row_len)
    if type_name == "Q5_1":
        b = _blocks(raw, 24)
        d, m = _f16(b, 0), _f16(b, 2)
        q = (_nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4)).astype(np.float32)
        return (d * q + m).reshape(rows, row_len)
    raise GGUFError(f"dequantization of {type_name} is not implemented in the reference reader")

def _main(argv):
    """Prints the metadata and tensor table of a GGUF file (for debugging)."""
    r = GGUFReader(argv[1])
    print(f"GGUF v{r.version}, {len(r.kv)} keys, {len(r.tensors)} tensors, "
          f"alignment {r.alignment}, data at {r.data_start}")
    for k, v in r.kv.items():
        if isinstance(v, (list, np.ndarray)) and len(v) > 8:
            v = f"[{len(v)} items]"
        print(f"  {k} = {v}")
    for t in r.tensors.values():
        print(f"  {t.name} {t.type_name} ne={list(t.ne)} offset={t.offset}")

if __name__ == "__main__":
    import sys
    _main(sys.argv)
