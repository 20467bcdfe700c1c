#!/usr/bin/env python3
"""Writes tests/io/data/gguf_transcode.gguf for tests/io/gguf_transcode_test.cpp,
tests/io/data/gguf_kquants.gguf for tests/io/gguf_test.cpp, tests/engine/data/kquant_moe.gguf
for tests/engine/conversion_loss_test.cpp and tests/engine/data/kquant_q2_moe.gguf for
tests/engine/kquant_in_place_test.cpp.

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

gguf_kquants.gguf holds the same for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: "<type>" and
"<type>.expected"), which moekit dequantizes to f32 (moekit/io/dequantize.hpp) and converts into
a store when they are experts; the test requires gguf-py's values bit for bit. Their blocks are
random bytes except: the f16 fields (d, and dmin where the type has one) take the special scales
above in the first blocks, paired with extreme code bytes (all 0x00, all 0xFF, 0x55/0xAA and
0x0F/0xF0 alternating: every 2-, 4- and 6-bit code at its ends, every packed scale at 0 and at its
largest), and in the next blocks with random codes; the other f16 fields are random finite halves.

kquant_moe.gguf is a random-weight Mixtral-style model (architecture "llama") whose experts are
K-quants as a Q4_K_M file holds them (gate and up Q4_K, down Q6_K): one decoder layer, hidden and
expert ffn 256 (one K-quant block per row), 4 experts top-2, 4 heads (2 KV heads), the 320-piece
vocabulary of tests/data/mixtral/model-f32.gguf (its tokenizer metadata copied), tied output. The
dense matrices are K-quants too (attn_q Q3_K, attn_k Q2_K, attn_v Q5_K, attn_output Q4_K,
token_embd Q6_K), the norms and the router F32. gguf-py cannot quantize K-quants, so the blocks
are random bytes whose f16 d (and dmin) are set so that the weights have the wanted RMS and, for
the types with a minimum, mean about 0. kquant_q2_moe.gguf is the same model with two decoder
layers whose experts are mixed as a Q2_K file's small types: layer 0 gate and up Q2_K, down Q3_K;
layer 1 gate and up Q3_K, down Q4_K (tests/engine/kquant_in_place_test.cpp).

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

DATA = Path(__file__).resolve().parent.parent / "tests" / "io" / "data"
OUT = DATA / "gguf_transcode.gguf"
KQUANT_OUT = DATA / "gguf_kquants.gguf"
MODEL_OUT = DATA.parent.parent / "engine" / "data" / "kquant_moe.gguf"
Q2_MODEL_OUT = DATA.parent.parent / "engine" / "data" / "kquant_q2_moe.gguf"
TOKENIZER_SOURCE = DATA.parent.parent / "data" / "mixtral" / "model-f32.gguf"
# For the types with a minimum, dmin / d that centres the weights: mean(sc)·mean(q) / mean(m).
KQUANT_DMIN_RATIO = {T.Q2_K: 1.5, T.Q4_K: 7.5, T.Q5_K: 15.5}
# A small seed for the GGUF fuzz target (tests/fuzz/fuzz_gguf.cpp): one block of each K-quant.
FUZZ_SEED = DATA.parent.parent / "fuzz" / "corpus" / "gguf" / "kquant_blocks.gguf"

# Byte offsets of each K-quant block's f16 fields (ggml-common.h's block_q*_K).
KQUANT_HALVES = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
KQUANT_CODE_BYTES = [0x00, 0xFF, (0x55, 0xAA), (0x0F, 0xF0)]

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


def kquant_blocks(rng: np.random.Generator, qt: T, rows: int, cols: int) -> np.ndarray:
    """rows x (cols/256 blocks) raw bytes of K-quant type qt: special f16 fields with extreme
    code bytes, then special f16 fields with random codes, then random blocks (see the file
    comment)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    n = rows * cols // block
    halves = KQUANT_HALVES[qt]
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    codes = [i for i in range(nbytes) if not any(h <= i < h + 2 for h in halves)]
    specials = len(SPECIAL_SCALES)
    assert n >= 2 * specials + 4, "room for the special blocks and some random ones"
    for i in range(specials):
        pattern = KQUANT_CODE_BYTES[i % len(KQUANT_CODE_BYTES)]
        if isinstance(pattern, tuple):
            raw[i, codes] = np.resize(np.array(pattern, dtype=np.uint8), len(codes))
        else:
            raw[i, codes] = pattern
    for i in range(n):
        for k, h in enumerate(halves):
            bits = int(random_scales(rng, 1)[0])
            if i < 2 * specials:  # d takes special i, dmin special i + 3 (other pairings)
                bits = SPECIAL_SCALES[(i + 3 * k) % specials]
            raw[i, h:h + 2] = np.array([bits], dtype="<u2").view(np.uint8)
    return raw.reshape(rows, cols // block * nbytes)


def write_kquants() -> None:
    rng = np.random.default_rng(20261126)
    w = gguf.GGUFWriter(str(KQUANT_OUT), arch="llama")
    w.add_string("moekit.fixture", "gguf_kquants: Q2_K..Q6_K blocks and gguf-py's values")
    for name, qt in [("q2_k", T.Q2_K), ("q3_k", T.Q3_K), ("q4_k", T.Q4_K), ("q5_k", T.Q5_K),
                     ("q6_k", T.Q6_K)]:
        rows, cols = 4, 2048  # 32 blocks: 20 special, 12 random
        raw = kquant_blocks(rng, qt, rows, cols)
        w.add_tensor(name, raw, raw_dtype=qt)
        expected = dequantize(raw, qt).astype(np.float32).reshape(rows, cols)
        w.add_tensor(name + ".expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {KQUANT_OUT} ({KQUANT_OUT.stat().st_size} bytes)")


def write_fuzz_seed() -> None:
    rng = np.random.default_rng(20261127)
    w = gguf.GGUFWriter(str(FUZZ_SEED), arch="llama")
    for name, qt in [("q2_k", T.Q2_K), ("q3_k", T.Q3_K), ("q4_k", T.Q4_K), ("q5_k", T.Q5_K),
                     ("q6_k", T.Q6_K)]:
        raw = kquant_blocks(rng, qt, 1, 256 * 24)[:, : gguf.GGML_QUANT_SIZES[qt][1]]
        w.add_tensor(name, np.ascontiguousarray(raw), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {FUZZ_SEED} ({FUZZ_SEED.stat().st_size} bytes)")


def random_kquant_tensor(rng: np.random.Generator, qt: T, rows: int, cols: int,
                         rms: float) -> np.ndarray:
    """rows x cols weights of K-quant qt as raw blocks: random bytes, d and dmin scaled so that the
    dequantized weights have RMS `rms` (the weights are linear in d and dmin together)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    halves = KQUANT_HALVES[qt]

    def set_scale(d: float) -> None:
        for k, h in enumerate(halves):
            v = d * (KQUANT_DMIN_RATIO[qt] if k == 1 else 1.0)
            raw[:, h:h + 2] = np.array([v], dtype=np.float16).view(np.uint8)

    set_scale(1e-3)
    got = float(np.sqrt(np.mean(dequantize(raw, qt).astype(np.float64) ** 2)))
    set_scale(1e-3 * rms / got)
    return raw.reshape(rows, cols // block * nbytes)


def write_kquant_model(out: Path = MODEL_OUT, seed: int = 20261128,
                       name: str = "moekit-fixture-kquant-moe",
                       file_type: gguf.LlamaFileType = gguf.LlamaFileType.MOSTLY_Q4_K_M,
                       expert_types: tuple = ((T.Q4_K, T.Q4_K, T.Q6_K),)) -> None:
    """A random-weight MoE GGUF (the file comment); layer l's experts (gate, up, down) at
    expert_types[l]."""
    rng = np.random.default_rng(seed)
    hidden, ffn, experts, heads, kv_heads, vocab = 256, 256, 4, 4, 2, 320
    head_dim = hidden // heads
    src = gguf.GGUFReader(str(TOKENIZER_SOURCE))
    w = gguf.GGUFWriter(str(out), arch="llama")
    w.add_name(name)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(len(expert_types))
    w.add_feed_forward_length(ffn)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_vocab_size(vocab)
    w.add_file_type(file_type)
    for f in src.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        v = f.contents()
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, v)
        elif f.types[0] == gguf.GGUFValueType.STRING:
            w.add_string(f.name, v)
        elif f.types[0] == gguf.GGUFValueType.BOOL:
            w.add_bool(f.name, v)
        else:
            w.add_uint32(f.name, v)
    ones = np.ones(hidden, dtype=np.float32)

    def add(name: str, qt: T, rows: int, cols: int, rms: float, stack: int = 1) -> None:
        raw = random_kquant_tensor(rng, qt, stack * rows, cols, rms)
        shape = (stack, rows, raw.shape[1]) if stack > 1 else (rows, raw.shape[1])
        w.add_tensor(name, raw.reshape(shape), raw_dtype=qt)

    add("token_embd.weight", T.Q6_K, vocab, hidden, 0.15)
    for layer, (gate, up, down) in enumerate(expert_types):
        blk = f"blk.{layer}."
        w.add_tensor(blk + "attn_norm.weight", ones)
        add(blk + "attn_q.weight", T.Q3_K, hidden, hidden, 0.08)
        add(blk + "attn_k.weight", T.Q2_K, kv_heads * head_dim, hidden, 0.08)
        add(blk + "attn_v.weight", T.Q5_K, kv_heads * head_dim, hidden, 0.08)
        add(blk + "attn_output.weight", T.Q4_K, hidden, hidden, 0.08)
        w.add_tensor(blk + "ffn_norm.weight", ones)
        w.add_tensor(blk + "ffn_gate_inp.weight",
                     rng.normal(0, 0.5, size=(experts, hidden)).astype(np.float32))
        add(blk + "ffn_gate_exps.weight", gate, ffn, hidden, 0.08, experts)
        add(blk + "ffn_up_exps.weight", up, ffn, hidden, 0.08, experts)
        add(blk + "ffn_down_exps.weight", down, hidden, ffn, 0.08, experts)
    w.add_tensor("output_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


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
    write_kquants()
    write_fuzz_seed()
    write_kquant_model()
    write_kquant_model(Q2_MODEL_OUT, 20261129, "moekit-fixture-kquant-q2-moe",
                       gguf.LlamaFileType.MOSTLY_Q2_K,
                       ((T.Q2_K, T.Q2_K, T.Q3_K), (T.Q3_K, T.Q3_K, T.Q4_K)))


if __name__ == "__main__":
    main()
