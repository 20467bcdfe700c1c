# Shared by bench/scale/run.sh and policies.sh (sourced; they set $here to the repository root).

# raw_read FILE -> bytes/s at which moe-run's own loader reads the file's experts in place
# (bench/io/checkpoint_read.cpp: 16 experts, O_DIRECT, cold), the best of its readers: the disk
# as the engine sees it, which is what bounds an offloaded decode.
raw_read() {
  local bench="$here/build/release/bench/moekit_bench_checkpoint_read"
  [[ -x "$bench" ]] || cmake --build --preset release --target moekit_bench_checkpoint_read >&2
  sync && echo 3 > /proc/sys/vm/drop_caches
  "$bench" --gguf "$1" --reps 1 --experts 16 --io-threads 4 |
    awk '/^in place/ { if ($(NF-1) > best) best = $(NF-1) } END { printf "%.0f", best * 1e9 }'
}

model_file() {  # mixtral-4L -> the GGUF path, written when missing
  local arch="${1%-*}" layers="${1##*-}"
  layers="${layers%L}"
  local f="$here/build/real-shape-models/$arch-${layers}L-q4_0.gguf"
  [[ -f "$f" ]] || "$here/scripts/make_real_shape_model.sh" --arch "$arch" --layers "$layers" \
    --format gguf-q4_0 --out "$f" >&2
  echo "$f"
}
