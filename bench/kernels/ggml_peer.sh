#!/usr/bin/env bash
# ggml's CPU matrix-vector product (q8_0, q4_0, q2_K) on the Mixtral expert shapes, with cold
# weights rotated like moekit_bench_gemv, so the two can be compared in the same session.
#
#   bench/kernels/ggml_peer.sh [path/to/moekit_bench_gemv]
#
# Installs ggml-python (which builds ggml from source) into a virtual environment
# ($GGML_PEER_VENV, default build/ggml-peer-venv), times ggml_mul_mat with a 1-column activation
# for 1 and 2 threads, and then, if given, runs moekit's benchmark right after for the ratio.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${GGML_PEER_VENV:-$here/build/ggml-peer-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "ggml-python==0.0.45" numpy
fi

"$venv/bin/python" - <<'PY'
import ctypes, time
import numpy as np
import ggml

ROTATION = 160 << 20   # bytes of weight copies per configuration (> 4x this machine's 35.8 MiB LLC)
REPS = 30
types = [("q8_0", ggml.GGML_TYPE_Q8_0), ("q4_0", ggml.GGML_TYPE_Q4_0), ("q2_K", ggml.GGML_TYPE_Q2_K)]
shapes = [(14336, 4096), (4096, 14336)]

def run(qtype, rows, cols, threads):
    row_bytes = ggml.ggml_row_size(qtype, cols)
    mat_bytes = row_bytes * rows
    copies = max(2, ROTATION // mat_bytes)
    mem = copies * mat_bytes + 4 * (cols + rows) * 4 + 64 * (1 << 20) + copies * (ggml.ggml_graph_overhead() + 4 * ggml.ggml_tensor_overhead())
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
    try:
        src = (np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32) * 0.02)
        x = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, cols, 1)
        np.ctypeslib.as_array(ctypes.cast(x.contents.data, ctypes.POINTER(ctypes.c_float)), shape=(cols,))[:] = 0.5
        graphs = []
        for c in range(copies):
            w = ggml.ggml_new_tensor_2d(ctx, qtype, cols, rows)
            if c == 0:
                ggml.ggml_quantize_chunk(qtype, src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                         w.contents.data, 0, rows, cols, None)
                first = w
            else:
                ctypes.memmove(w.contents.data, first.contents.data, mat_bytes)
            y = ggml.ggml_mul_mat(ctx, w, x)
            gf = ggml.ggml_new_graph(ctx)
            ggml.ggml_build_forward_expand(gf, y)
            graphs.append(gf)
        for gf in graphs:  # warm-up
            ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)
        times = []
        for i in range(REPS):
            t0 = time.perf_counter()
            ggml.ggml_graph_compute_with_ctx(ctx, graphs[i % copies], threads)
            times.append(time.perf_counter() - t0)
        times.sort()
        return mat_bytes, times[len(times) // 2]
    finally:
        ggml.ggml_free(ctx)

print("ggml (ggml-python %s) mul_mat, n = 1, cold weights" % getattr(ggml, "__version__", "?"))
print("%-6s %-12s %8s %9s %9s" % ("type", "shape", "threads", "ms", "GB/s"))
for name, qtype in types:
    for rows, cols in shapes:
        for threads in (1, 2):
            b, s = run(qtype, rows, cols, threads)
            print("%-6s %5dx%-6d %8d %9.3f %9.2f" % (name, rows, cols, threads, s * 1e3, b / s / 1e9), flush=True)
PY

if [[ $# -ge 1 ]]; then
  echo
  "$1"
fi
