#!/usr/bin/env python3
"""Writes tests/io/data/gguf_transcode.gguf for tests/io/gguf_transcode_test.cpp.

Two raw tensors, "q4_0" and "q8_0" (GGUF blocks as llama.cpp stores them), each followed by
"<name>.expected": the F32 values that the `gguf` Python package (llama.cpp's gguf-py, MIT)
dequantizes them to. The test converts the blocks into moekit's q4 / q8 rows
(moekit/io/gguf_transcode.hpp), decodes those with moekit's own decoder and requires gguf-py's
values bit for bit, so the conversion is checked against an implementation moekit shares no code
with.

The blocks are random except for the cases a byte permutation could get wrong: the extreme codes
(nibbles 0 and 15, alternating; int8 -128 and 127, alternating) and f16 scales that are zero of
either sign, subnormal, the largest finite, and negative; the other scales are random finite
halves (exponents 0 to 30, so subnormals too).

Pinned versions (what the committed file was made with): gguf==0.19.0 numpy==2.4.6, e.g.
  python3 -m venv build/venv && build/venv/bin/pip install gguf==0.19.0 numpy==2.4.6
  build/venv/bin/python scripts/make_gguf_transcode_fixture.py
Deterministic (fixed seed): a re-run writes the same bytes.
"""
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "io" / "data" / "gguf_transcode.gguf"

# f16 bit patterns: +0, -0, smallest subnormal, largest subnormal (negative), smallest normal,
# largest finite and its negative, 1, -1, a negative subnormal.
SPECIAL_SCALES = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x8001]


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random finite f16 bit patterns: any sign, exponent 0..30 (subnormals included)."""
    sign = rng.integers(0, 2, size=n, dtype=np.uint16) << 15
    exponent = rng.integers(0, 31, size=n, dtype=np.uint16) << 10
    mantissa = rng.integers(0, 1024, size=n, dtype=np.uint16)
    return sign | exponent | mantissa


def extreme_codes(qt: T, nbytes: int) -> list[np.ndarray]:
    """The code bytes of the blocks with extreme codes only."""
    n = nbytes - 2
    if qt == T.Q4_0:  # nibbles all 0, all 15, then 0/15 and 15/0 within each byte
        return [np.full(n, b, dtype=np.uint8) for b in (0x00, 0xFF, 0xF0, 0x0F)]
    alternating = np.tile(np.array([0x80, 0x7F], dtype=np.uint8), n // 2)
    return [np.full(n, 0x80, dtype=np.uint8), np.full(n, 0x7F, dtype=np.uint8), alternating]


def blocks(rng: np.random.Generator, qt: T, rows: int, cols: int) -> np.ndarray:
    """rows x (cols/32 blocks) raw bytes of type qt. The first blocks pair extreme codes with the
    special scales (cycling through both lists, so each code pattern meets several scales); the
    rest are random codes with random scales."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    scales = random_scales(rng, n)
    codes = extreme_codes(qt, nbytes)
    for i in range(2 * len(SPECIAL_SCALES)):
        raw[i, 2:] = codes[i % len(codes)]
        scales[i] = SPECIAL_SCALES[i % len(SPECIAL_SCALES)]
    raw[:, 0:2] = scales.astype("<u2").view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * nbytes)


def main() -> None:
    rng = np.random.default_rng(20251126)
    w = gguf.GGUFWriter(str(OUT), arch="llama")
    w.add_string("moekit.fixture", "gguf_transcode: Q4_0 / Q8_0 blocks and gguf-py's values")
    for name, qt, rows, cols in [("q4_0", T.Q4_0, 8, 128), ("q8_0", T.Q8_0, 8, 128)]:
        raw = blocks(rng, qt, rows, cols)
        w.add_tensor(name, raw, raw_dtype=qt)
        expected = dequantize(raw, qt).astype(np.float32).reshape(rows, cols)
        w.add_tensor(name + ".expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
