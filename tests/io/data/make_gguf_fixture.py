#!/usr/bin/env python3
"""Writes quant_blocks.gguf: random raw blocks of Q8_0, Q4_0, Q4_K and Q2_K, each followed by
"<name>.expected", the F32 values that the `gguf` Python package (llama.cpp's gguf-py, MIT)
dequantizes them to. gguf_test.cpp checks moekit's scalar dequantization against them, so the
block layouts are cross-checked against an independent implementation. Needs `pip install gguf`
only to regenerate; the test reads the committed file.
Run: python3 make_gguf_fixture.py  (deterministic: fixed seed)."""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(20240611)
w = gguf.GGUFWriter("quant_blocks.gguf", arch="llama")
w.add_string("moekit.fixture", "quant blocks cross-check")
for name, qt, rows, cols in [("q8_0", T.Q8_0, 2, 64), ("q4_0", T.Q4_0, 2, 64),
                             ("q4_k", T.Q4_K, 2, 512), ("q2_k", T.Q2_K, 3, 256)]:
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(rows, cols // block * nbytes), dtype=np.uint8)
    # keep the f16 scales finite and moderate: overwrite them with small random halves
    scales = rng.uniform(-2, 2, size=(rows, cols // block, 2)).astype(np.float16).view(np.uint8)
    r = raw.reshape(rows, cols // block, nbytes)
    if qt in (T.Q8_0, T.Q4_0):
        r[:, :, 0:2] = scales[:, :, 0:2]
    elif qt == T.Q4_K:
        r[:, :, 0:4] = scales
    elif qt == T.Q2_K:
        r[:, :, 80:84] = scales
    raw = r.reshape(rows, -1)
    w.add_tensor(name, raw, raw_dtype=qt)
    expected = dequantize(raw, qt).astype(np.float32).reshape(rows, cols)
    w.add_tensor(name + ".expected", expected)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
