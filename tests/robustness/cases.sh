#!/usr/bin/env bash
# The robustness suite (issue 24): each case runs a built tool on a bad input or under a fault and
# asserts the clean outcome — a non-zero exit, a message naming the file/field/flag, no output left
# behind and nothing overwritten (the working directory is compared before and after).
#   cases.sh CASE BUILD_DIR SOURCE_DIR
# ctest runs one test per case (tests/robustness/CMakeLists.txt lists the case_* functions here).
set -uo pipefail

case_name=$1
build=$(cd "$2" && pwd)
src=$(cd "$3" && pwd)
moe_run=$build/examples/moe-run/moe-run
moe_convert=$build/examples/moe-convert/moe-convert
moe_sim=$build/examples/moe-sim/moe-sim
moe_calibrate=$build/examples/moe-calibrate/moe-calibrate
inject=$build/tests/robustness/moekit_inject_fault
fixture=$src/tests/data/mixtral  # a 2-layer, 4-expert Mixtral checkpoint (tests/data/README.md)

root=$(mktemp -d "${TMPDIR:-/tmp}/moekit-robustness.XXXXXX")
trap 'rm -rf "$root"' EXIT
work=$root/work  # what the tools see; their stdout/stderr go to $root, outside it
mkdir "$work" && cd "$work" || exit 1

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Everything under the working directory, with sizes, times and types: a failing command must
# leave it as it was. Paths matching $allow_new (a case sets it) are left out: moe-convert keeps
# the .partial file of a failed run by design, to resume it.
allow_new='^$'
snapshot() { find . -mindepth 1 -printf '%p %y %s %T@\n' | grep -Ev "$allow_new" | LC_ALL=C sort; }

# expect_refusal REGEX CMD...: CMD exits non-zero, its stderr matches REGEX (extended), and the
# working directory is unchanged.
expect_refusal() {
  local pattern=$1
  shift
  local before after rc
  before=$(snapshot)
  local err_file=$root/stderr
  # stderr through a pipe: a case that limits file sizes (ulimit -f) must not lose it
  "$@" 2>&1 >"$root/stdout" | cat >"$err_file"
  rc=${PIPESTATUS[0]}
  after=$(snapshot)
  echo "\$ $*"
  echo "  exit $rc: $(head -c 600 "$err_file")"
  [[ $rc -ne 0 ]] || fail "exit code 0, expected a refusal"
  grep -Eq -- "$pattern" "$err_file" || fail "stderr does not match /$pattern/"
  [[ "$before" == "$after" ]] || fail "the working directory changed: $(diff <(echo "$before") <(echo "$after"))"
}

# expect_success CMD...: CMD exits 0 (a setup step, or the opt-out of a check).
expect_success() {
  "$@" >"$root/out" 2>&1 || fail "'$*' failed: $(tail -c 600 "$root/out")"
}

# Runs a command with its address space bounded (a regression then fails instead of filling the
# machine's memory); sanitizer builds reserve terabytes of shadow memory, so not there.
limited() {
  if [[ -n "${MOEKIT_SANITIZED:-}" ]]; then "$@"; else bash -c 'ulimit -v 4000000; exec "$@"' _ "$@"; fi
}

model_copy() {  # model_copy DIR: a private copy of the fixture checkpoint
  cp -r "$fixture" "$1"
}

store_of() {  # store_of MODEL_DIR STORE: an expert store of the checkpoint, f32 and q8
  expect_success "$moe_convert" -m "$1" -o "$2" --precisions f32,q8
}

run_args=(-p "Hello world" -n 4 --temp 0 --no-direct)

# ---- data integrity ---------------------------------------------------------------------------

case_store_flipped_byte() {  # one flipped byte in a blob: an error naming store, layer, expert
  model_copy model && store_of model s.moestore
  "$inject" flip-blob s.moestore 1 2 q8 || fail "inject"
  expect_refusal "s\.moestore.*layer 1, expert 2, q8.*XXH64" \
    "$moe_run" -m s.moestore --precision q8 --expert-budget 25% "${run_args[@]}"
  # the opt-out runs (and says nothing about the damage)
  expect_success "$moe_run" -m s.moestore --precision q8 --no-verify "${run_args[@]}"
}

case_store_of_other_checkpoint() {  # --store built from another checkpoint of the same shape
  model_copy a && model_copy b && touch -d '2001-01-01' b/model.safetensors
  store_of a s.moestore
  expect_refusal "--store: expert store 's\.moestore' was built from the checkpoint '.*/a'.*the checkpoint given is 'b'" \
    "$moe_run" -m b --store s.moestore "${run_args[@]}"
  expect_success "$moe_run" -m b --store s.moestore --force "${run_args[@]}"
}

case_store_checkpoint_changed() {  # -m STORE whose checkpoint changed since it was built
  model_copy a && store_of a s.moestore
  touch -d '2001-01-01' a/model.safetensors
  expect_refusal "-m: expert store 's\.moestore' was built from the checkpoint .*changed since" \
    "$moe_run" -m s.moestore "${run_args[@]}"
}

case_nan_dense_tensor() {  # NaN in q_proj: refused naming file, tensor and index
  model_copy m
  "$inject" nan-tensor m/model.safetensors model.layers.1.self_attn.q_proj.weight 37 || fail "inject"
  expect_refusal "model\.layers\.1\.self_attn\.q_proj\.weight' in '.*m/model\.safetensors'.*index 37.*not finite" \
    "$moe_run" -m m --in-memory "${run_args[@]}"
}

case_inf_router() {  # +Inf in a router: refused naming the tensor
  model_copy m
  "$inject" nan-tensor m/model.safetensors model.layers.0.block_sparse_moe.gate.weight 5 inf || fail "inject"
  expect_refusal "block_sparse_moe\.gate\.weight.*index 5.*not finite" \
    "$moe_run" -m m --in-memory "${run_args[@]}"
}

case_nan_expert_convert() {  # NaN in an expert: moe-convert names tensor, file, layer and expert
  model_copy m
  "$inject" nan-tensor m/model.safetensors model.layers.1.block_sparse_moe.experts.3.w2.weight 7 || fail "inject"
  allow_new='s\.moestore\.partial'
  expect_refusal "experts\.3\.w2\.weight' in '.*model\.safetensors'.*layer 1, expert 3.*index 7.*not finite" \
    "$moe_convert" -m m -o s.moestore --precisions q4
}

case_nan_logits_at_run_time() {  # NaN in an expert read in place (f32, no encoding): the logits
  model_copy m
  "$inject" nan-tensor m/model.safetensors model.layers.0.block_sparse_moe.experts.0.w1.weight 0 || fail "inject"
  "$inject" nan-tensor m/model.safetensors model.layers.0.block_sparse_moe.experts.1.w1.weight 0 || fail "inject"
  "$inject" nan-tensor m/model.safetensors model.layers.0.block_sparse_moe.experts.2.w1.weight 0 || fail "inject"
  "$inject" nan-tensor m/model.safetensors model.layers.0.block_sparse_moe.experts.3.w1.weight 0 || fail "inject"
  expect_refusal "logit of token [0-9]+ at position [0-9]+ is nan \(not finite\)" \
    "$moe_run" -m m --precision auto "${run_args[@]}"
  printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..8} > text.txt
  expect_refusal "--perplexity: the model's logit of token [0-9]+ at scored position 0 is nan \(not finite\)" \
    "$moe_run" -m m --precision auto --no-direct --perplexity text.txt -c 16
}

case_truncated_inputs() {  # a checkpoint, store, GGUF, config, trace or .mklogp cut short or corrupt
  model_copy m && store_of m s.moestore
  printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..8} > text.txt
  expect_success "$moe_run" -m m --in-memory "${run_args[@]}" --trace-out r.mktrace
  expect_success "$moe_run" -m m --in-memory --perplexity text.txt -c 16 --save-logits ref.mklogp
  model_copy t
  truncate -s 150000 t/model.safetensors
  expect_refusal "t/model\.safetensors'.*run past the [0-9]+-byte data section" \
    "$moe_run" -m t --in-memory "${run_args[@]}"
  rm -rf t && model_copy t
  printf '{"architectures": ["MixtralForCausalLM"], "hidden_size": ' > t/config.json
  expect_refusal "config '.*t/config\.json' is not valid JSON" "$moe_run" -m t "${run_args[@]}"
  cp s.moestore cut.moestore && truncate -s $(($(stat -c %s s.moestore) - 5000)) cut.moestore
  expect_refusal "cut\.moestore': header records [0-9]+ bytes but the file has" "$moe_run" -m cut.moestore "${run_args[@]}"
  head -c 8192 /dev/urandom > noise.moestore
  expect_refusal "'noise\.moestore' is neither" "$moe_run" -m noise.moestore "${run_args[@]}"
  cp "$fixture/model-f32.gguf" cut.gguf && truncate -s 100000 cut.gguf
  expect_refusal "GGUF 'cut\.gguf'.*runs past the end of the 100000-byte file" "$moe_run" -m cut.gguf "${run_args[@]}"
  cp r.mktrace cut.mktrace && truncate -s $(($(stat -c %s r.mktrace) - 3)) cut.mktrace
  expect_refusal "trace 'cut\.mktrace': field" "$moe_sim" --trace cut.mktrace
  cp ref.mklogp cut.mklogp && truncate -s $(($(stat -c %s ref.mklogp) - 3)) cut.mklogp
  expect_refusal "--kl-reference: 'cut\.mklogp': size does not match" \
    "$moe_run" -m m --in-memory --perplexity text.txt -c 16 --kl-reference cut.mklogp
}

# cut_while_running MODEL FILE: runs moe-run on MODEL with 2 of its 8 experts in memory, cuts FILE
# to half its size while it runs, and asserts an error naming FILE and an offset, in time.
cut_while_running() {
  local model=$1 file=$2 pid rc drain i
  # moe-run's stdout is a pipe filled up beforehand: it opens and checks the model, then blocks
  # writing the prompt, before the first expert is read. The file is cut there; the pipe is
  # drained and moe-run goes on reading experts, some of them past the cut.
  rm -f tokens && mkfifo tokens
  exec 8<>tokens
  dd if=/dev/zero of=/dev/fd/8 bs=1 oflag=nonblock status=none 2>/dev/null  # until the pipe is full
  "$moe_run" -m "$model" --precision f32 --expert-budget 25% -p "Hello world" -n 100 --temp 0 \
    --no-direct >tokens 2>"$root/stderr" &  # a hang: ctest's timeout
  pid=$!
  for ((i = 0; i < 3000; ++i)); do  # up to 30 s for moe-run to block in its first write
    [[ "$(cat /proc/$pid/wchan 2>/dev/null)" == *pipe_write* ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  [[ "$(cat /proc/$pid/wchan 2>/dev/null)" == *pipe_write* ]] || fail "moe-run did not block writing"
  truncate -s $(($(stat -c %s "$file") / 2)) "$file"
  cat <&8 >/dev/null &
  drain=$!
  wait "$pid"
  rc=$?
  kill "$drain" 2>/dev/null
  wait "$drain" 2>/dev/null
  exec 8<&-
  echo "\$ moe-run -m $model, $file cut while it runs"
  echo "  exit $rc: $(head -c 600 "$root/stderr")"
  [[ $rc -ne 0 ]] || fail "exit code 0, expected an error"
  grep -Eq "'${file//./\\.}' at offset [0-9]+" "$root/stderr" ||
    fail "the error does not name '$file' and the offset"
}

case_store_truncated_while_running() {  # a store, or a checkpoint read in place, cut mid-run
  model_copy m && store_of m s.moestore
  cut_while_running s.moestore s.moestore
  rm -rf m && model_copy m
  cut_while_running m m/model.safetensors
}

# A file size limit (ulimit -f) stops moe-convert where it sizes OUT.partial (ftruncate to the
# store's size: EFBIG, "cannot size"), before any blob is written; a disk that fills up lets that
# sparse ftruncate pass and fails a write in the middle: case_convert_disk_full_mid_write.
case_convert_disk_full() {  # moe-convert out of disk: only OUT.partial is left; a rerun resumes it
  model_copy m
  allow_new='s\.moestore\.partial'
  expect_refusal "s\.moestore.*(File too large|No space|write)" \
    bash -c 'trap "" XFSZ; ulimit -f 100; exec "$@"' _ "$moe_convert" -m m -o s.moestore --precisions f32,q8
  [[ -e s.moestore.partial ]] || fail "no s.moestore.partial kept to resume"
  expect_refusal "s\.moestore\.partial" "$moe_run" -m s.moestore.partial "${run_args[@]}"
  allow_new='^$'
  expect_success "$moe_convert" -m m -o s.moestore --precisions f32,q8
  [[ -e s.moestore.partial ]] && fail "the .partial file was left after the resumed run"
  expect_success "$moe_convert" -m m -o fresh.moestore --precisions f32,q8
  cmp -s s.moestore fresh.moestore || fail "the resumed store differs from one converted at once"
}

case_convert_disk_full_mid_write() {  # the file system fills up while the blobs are written
  model_copy m
  expect_success "$moe_convert" -m m -o whole.moestore --precisions f32,q8
  local bytes
  bytes=$(stat -c %s whole.moestore)
  # A tmpfs of half the store: the sizing ftruncate passes (sparse), a blob's write fails.
  mkdir small
  if [[ $EUID -ne 0 ]] || ! mount -t tmpfs -o "size=$((bytes / 2))" moekit-full small 2>/dev/null; then
    echo "WARN: skipped: mounting a small tmpfs needs root (and mount(2) allowed)"
    return
  fi
  trap 'umount "$work/small" 2>/dev/null; rm -rf "$root"' EXIT
  allow_new='^\./small( |/s\.moestore\.partial(\.journal)? )'  # the directory, the .partial
  expect_refusal "small/s\.moestore\.partial.*(No space left on device|write)" \
    "$moe_convert" -m m -o small/s.moestore --precisions f32,q8
  [[ -e small/s.moestore.partial ]] || fail "no small/s.moestore.partial kept to resume"
  local written
  written=$(du -B1 small/s.moestore.partial | cut -f1)
  [[ $written -gt 0 ]] || fail "nothing was written before the disk was full: not a mid-write failure"
  # room again: the rerun resumes the .partial and leaves the same store as one converted at once
  mount -o remount,size=$((bytes * 3)) small || fail "cannot grow the tmpfs"
  allow_new='^$'
  expect_success "$moe_convert" -m m -o small/s.moestore --precisions f32,q8
  [[ -e small/s.moestore.partial ]] && fail "the .partial file was left after the resumed run"
  cmp -s small/s.moestore whole.moestore || fail "the resumed store differs from one converted at once"
  umount small || fail "cannot unmount the tmpfs"
}

# ---- writers ----------------------------------------------------------------------------------

case_sim_out_refuses_overwrite() {  # moe-sim --sweep --out: existing CSV kept without --force
  echo "keep me" > sweep.csv
  expect_refusal "--out: 'sweep\.csv' exists; refusing to overwrite it \(pass --force\)" \
    "$moe_sim" --synthetic --sweep budget=25%,50% --out sweep
  expect_success "$moe_sim" --synthetic --sweep budget=25%,50% --out sweep --force
  grep -q "keep me" sweep.csv && fail "--force did not replace sweep.csv"
}

case_sim_out_unwritable() {  # moe-sim --out into a missing directory: refused before the runs
  expect_refusal "--out: 'no/such/dir/sweep\.csv' cannot be written: the directory 'no/such/dir' does not exist" \
    "$moe_sim" --synthetic --sweep budget=25%,50% --out no/such/dir/sweep
  mkdir d
  expect_refusal "--out: 'd/' is a directory" \
    "$moe_sim" --synthetic --sweep budget=25%,50% --out d/
  expect_refusal "--out: 'd' is a directory" \
    "$moe_sim" --synthetic --sweep budget=25%,50% --out d
}

case_disk_full_writers() {  # a full disk (file size limit 0: EFBIG) leaves no partial file
  model_copy m
  printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..8} > text.txt
  expect_refusal "--trace-out: write error on 'r\.mktrace'" \
    bash -c 'trap "" XFSZ; ulimit -f 0; exec "$@"' _ "$moe_run" -m m --in-memory "${run_args[@]}" --trace-out r.mktrace
  expect_refusal "--save-logits: write error on 'l\.mklogp'" \
    bash -c 'trap "" XFSZ; ulimit -f 0; exec "$@"' _ "$moe_run" -m m --in-memory --no-direct --perplexity text.txt -c 16 --save-logits l.mklogp
  expect_refusal "--out: write error on 'sweep\.csv'" \
    bash -c 'trap "" XFSZ; ulimit -f 0; exec "$@"' _ "$moe_sim" --synthetic --sweep budget=25%,50% --out sweep
}

case_force_never_replaces_a_device() {  # --force and a FIFO (as root, /dev/full would be deleted)
  model_copy m
  mkfifo pipe
  expect_refusal "-o: 'pipe' exists and is not a regular file" \
    "$moe_convert" -m m -o pipe --precisions q8 --force
  expect_refusal "--trace-out: 'pipe' exists and is not a regular file" \
    "$moe_run" -m m --in-memory "${run_args[@]}" --trace-out pipe --force
  [[ -p pipe ]] || fail "the FIFO was replaced"
}

case_output_checked_up_front() {  # a directory or a missing directory as the output: before work
  model_copy m
  mkdir out.mktrace
  expect_refusal "--trace-out: 'out\.mktrace' is a directory" \
    "$moe_run" -m m --in-memory "${run_args[@]}" --trace-out out.mktrace
  expect_refusal "-o: 'missing/s\.moestore' cannot be written: the directory 'missing' does not exist" \
    "$moe_convert" -m m -o missing/s.moestore --precisions q8
  expect_refusal "--out: 'missing/hw\.json' cannot be written.*does not exist" \
    "$moe_calibrate" --out missing/hw.json --disk-size 4MiB --reps 1
}

case_convert_lock() {  # a second moe-convert -o SAME is refused at once
  model_copy m
  command -v flock >/dev/null || { fail "flock(1) (util-linux) is needed for this case"; return; }
  exec 9>s.moestore.lock  # this shell holds the lock, as a first moe-convert would
  flock -n 9 || fail "cannot take the lock"
  expect_refusal "another process is writing 's\.moestore'" \
    "$moe_convert" -m m -o s.moestore --precisions q8
  exec 9>&-
}

case_kl_reference_other_chunking() {  # .mklogp of -c 16 against a run with -c 8
  model_copy m
  printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..8} > text.txt
  expect_success "$moe_run" -m m --in-memory --perplexity text.txt -c 16 --save-logits ref.mklogp
  expect_refusal "--kl-reference: 'ref\.mklogp' was scored in chunks of 16 tokens.*chunks of 8" \
    "$moe_run" -m m --in-memory --perplexity text.txt -c 8 --kl-reference ref.mklogp
}

case_unbounded_inputs() {  # a device where a text file is expected: refused, not read forever
  model_copy m
  expect_refusal "--perplexity: '/dev/zero' is not a regular file" \
    limited "$moe_run" -m m --in-memory --perplexity /dev/zero
  expect_refusal "--trace: '/dev/zero' is not a regular file" \
    limited "$moe_sim" --trace /dev/zero
  printf 'Hello there. %.0s' {1..8} > text.txt
  expect_refusal "--kl-reference: '/dev/zero' is not a regular file" \
    limited "$moe_run" -m m --in-memory --perplexity text.txt --kl-reference /dev/zero
}

case_input_files_not_regular() {  # every other input file flag: a device or a directory, named
  model_copy m
  mkdir d
  local flag
  for flag in --bitwidth-table --popularity --store; do
    expect_refusal "$flag: '/dev/zero' is not a regular file" \
      limited "$moe_run" -m m "${run_args[@]}" "$flag" /dev/zero
    expect_refusal "$flag: 'd' is not a regular file" limited "$moe_run" -m m "${run_args[@]}" "$flag" d
  done
  for flag in --bitwidths --routers --hardware-file; do
    expect_refusal "$flag: '/dev/zero' is not a regular file" \
      limited "$moe_sim" --synthetic "$flag" /dev/zero
  done
}

# ---- resources and small validations ---------------------------------------------------------

case_context_beyond_the_model() {  # -c beyond max_position_embeddings: refused before the KV cache
  model_copy m
  expect_refusal "-c: context length 100000000 exceeds the model's max_position_embeddings \(128\)" \
    limited "$moe_run" -m m --in-memory --expert-budget all "${run_args[@]}" -c 100000000
}

case_flag_values() {  # values the parser used to accept or pass through to an internal check
  model_copy m
  expect_refusal "--seed" "$moe_run" -m m --in-memory "${run_args[@]}" --seed -1
  expect_refusal "--lookahead.*(range|1 - 3)" "$moe_run" -m m --in-memory --preset hobbit "${run_args[@]}" --lookahead 5
  expect_refusal "--cpu-latency: must be a number of seconds" \
    "$moe_run" -m m --in-memory --preset fiddler "${run_args[@]}" --cpu-latency nan
  expect_refusal "--gamma" "$moe_sim" --synthetic --preset mobile --gamma 5
  expect_refusal "--budget: '99999999999999999999' is too large" "$moe_sim" --synthetic --budget 99999999999999999999
  expect_refusal "--budget: '1000' slots exceed the trace's 256 experts" "$moe_sim" --synthetic --budget 1000
  expect_refusal "--hidden" "$moe_sim" --synthetic --hidden 4294967295 --ffn 4294967295
}

case_config_values() {  # config.json fields out of range
  model_copy m
  sed -i 's/"eos_token_id": 2/"eos_token_id": 99999/' m/config.json
  expect_refusal "eos_token_id.*99999 is not below vocab_size" "$moe_run" -m m --in-memory "${run_args[@]}"
  rm -rf m && model_copy m
  sed -i 's/"max_position_embeddings": 128/"max_position_embeddings": 0/' m/config.json
  expect_refusal "max_position_embeddings.*must be > 0" "$moe_run" -m m --in-memory "${run_args[@]}"
}

case_absurd_metadata() {  # counts of 1e9 and sizes of 4e9: refused before anything is sized by them
  model_copy m
  sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1000000000/' m/config.json
  expect_refusal "config '.*m/config\.json': field 'num_hidden_layers' is 1000000000, more than moekit reads" \
    limited "$moe_run" -m m "${run_args[@]}"
  rm -rf m && model_copy m
  sed -i 's/"num_local_experts": 4/"num_local_experts": 1000000000/' m/config.json
  expect_refusal "field 'num_local_experts' is 1000000000, more than moekit reads" \
    limited "$moe_run" -m m "${run_args[@]}"
  expect_refusal "field 'num_local_experts' is 1000000000" \
    limited "$moe_convert" -m m -o s.moestore --precisions q8
  local key value
  for key_value in "llama.block_count 1000000000" "llama.expert_count 1000000000" "llama.expert_count 3" \
    "llama.feed_forward_length 4000000000"; do
    read -r key value <<<"$key_value"
    cp "$fixture/model-f32.gguf" a.gguf && "$inject" gguf-set-uint a.gguf "$key" "$value" || fail "inject"
    expect_refusal "GGUF 'a\.gguf': metadata '$key' (is|gives experts of) $value" \
      limited "$moe_run" -m a.gguf "${run_args[@]}"
    rm a.gguf
  done
}

case_config_disagrees_with_tensors() {  # fewer or more layers/experts than the weights: refused
  model_copy m
  sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' m/config.json
  expect_refusal "'num_hidden_layers' is 1 but the checkpoint 'm' holds tensors of 2 layers: 'model\.layers\.1\..*' would be unused" \
    "$moe_run" -m m "${run_args[@]}"
  expect_refusal "'num_hidden_layers' is 1 but the checkpoint 'm' holds tensors of 2 layers" \
    "$moe_convert" -m m -o s.moestore --precisions q8
  rm -rf m && model_copy m
  sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' m/config.json
  expect_refusal "'num_hidden_layers' is 3 but the checkpoint 'm' has no tensor of layer 2" \
    "$moe_run" -m m "${run_args[@]}"
  rm -rf m && model_copy m
  sed -i 's/"num_local_experts": 4/"num_local_experts": 3/' m/config.json
  expect_refusal "'num_local_experts' is 3 but .*experts\.3\.w1\.weight' would be unused" \
    "$moe_run" -m m "${run_args[@]}"
  rm -rf m && model_copy m
  sed -i 's/"num_local_experts": 4/"num_local_experts": 6/' m/config.json
  expect_refusal "'num_local_experts' is 6 but the checkpoint 'm' has no tensor of expert 4 of layer 0" \
    "$moe_run" -m m "${run_args[@]}"
  cp "$fixture/model-f32.gguf" a.gguf && "$inject" gguf-set-uint a.gguf llama.block_count 1 || fail "inject"
  expect_refusal "GGUF 'a\.gguf': metadata 'llama\.block_count' is 1 but the checkpoint 'a\.gguf' holds tensors of 2 layers" \
    "$moe_run" -m a.gguf "${run_args[@]}"
  rm a.gguf
}

case_memory_does_not_fit() {  # KV cache, experts... beyond the memory the process may use
  model_copy m
  sed -i 's/"max_position_embeddings": 128/"max_position_embeddings": 4000000000/' m/config.json
  # 358 GiB of f16 KV cache: beyond any machine this runs on, refused before a byte is allocated
  expect_refusal "-c: the KV cache \(f16\) at -c 3000000000 \(357\.6 GiB\) does not fit in the .* this process may use" \
    "$moe_run" -m m --expert-budget all "${run_args[@]}" -c 3000000000
  expect_refusal "--expert-budget auto: .* of memory missing.*KV cache" \
    "$moe_run" -m m --expert-budget auto "${run_args[@]}" -c 3000000000
  if [[ -z "${MOEKIT_SANITIZED:-}" ]]; then  # ulimit -v counts: 7.2 GiB of KV cache in 4 GB
    expect_refusal "-c: the KV cache \(f32\) at -c 30000000 \(7\.2 GiB\) does not fit .*\(ulimit -v \(RLIMIT_AS\)\)" \
      limited "$moe_run" -m m --expert-budget all "${run_args[@]}" -c 30000000 --kv-type f32
    # 3.6 GiB of f16 KV cache passes the check (its sizes are lower bounds) and the rest of the
    # address space runs out: a named error, not a bare std::bad_alloc
    expect_refusal "out of memory .*ulimit -v \(RLIMIT_AS\).*-c" \
      limited "$moe_run" -m m --expert-budget all "${run_args[@]}" -c 30000000
  fi
}

case_prompt_beyond_the_model() {  # a prompt longer than max_position_embeddings, without -c
  model_copy m
  expect_refusal "-p: the prompt and -n need [0-9]+ positions, more than the model's max_position_embeddings \(128\)" \
    "$moe_run" -m m -p "$(printf 'Hello world %.0s' {1..100})" -n 4 --temp 0 --no-direct
}

case_thread_creation_fails() {  # threads that cannot be created: an error, not terminate()
  [[ -z "${MOEKIT_SANITIZED:-}" ]] || { echo "skipped under sanitizers (ulimit -v)"; return; }
  model_copy m
  expect_refusal "-t 64: ThreadPool: cannot start thread [0-9]+ of 64 .*use fewer threads" \
    bash -c 'ulimit -v 300000; exec "$@"' _ "$moe_run" -m m --in-memory --expert-budget all "${run_args[@]}" -t 64
}

case_shape_flags() {  # preset flags beyond the model, empty paths, a calibration disk in memory
  model_copy m
  expect_refusal "--k-little: 9 experts in the little pass is more than the model's top-k \(2\)" \
    "$moe_run" -m m --preset mobile "${run_args[@]}" --k-little 9
  expect_refusal "--shallow-layers: 1000 is more than the model's 2 MoE layers" \
    "$moe_run" -m m --preset fate "${run_args[@]}" --shallow-layers 1000
  expect_refusal "--trace-out: an empty path" "$moe_run" -m m "${run_args[@]}" --trace-out ""
  expect_refusal "--preset hobbit-oracle: needs --routing-trace FILE" \
    "$moe_run" -m m --preset hobbit-oracle "${run_args[@]}"
  expect_refusal "--oracle-recall: every figure must be in \[0, 1\]" \
    "$moe_run" -m m --preset hobbit "${run_args[@]}" --oracle-recall 0.9,1.5
  expect_refusal "--disk-size: '1MiB' is below the 4MiB read chunk" \
    "$moe_calibrate" --out hw.json --disk-size 1MiB --reps 1
  if [[ "$(stat -f -c %T /dev/shm 2>/dev/null)" == tmpfs ]]; then
    expect_refusal "--disk-dir: '/dev/shm' is in memory \(tmpfs/ramfs\), not on a disk" \
      "$moe_calibrate" --out hw.json --disk-dir /dev/shm --disk-size 4MiB --reps 1
  fi
}

case_routing_trace_used_up() {  # a trace the measured run replays whole leaves nothing to calibrate
  model_copy m
  # The run's own routing as a trace: the prompt and 3 decode tokens, all of it replayed again.
  expect_success "$moe_run" -m m "${run_args[@]}" --trace-out t.mktrace
  expect_refusal "--routing-trace 't.mktrace': a [0-9]+-token prompt and -n 4 replay all but 0 of its tokens" \
    "$moe_run" -m m --preset edgemoe "${run_args[@]}" --routing-trace t.mktrace
  # With -n 2 the last decode tokens are left to calibrate on: it runs, calibrated on them.
  expect_success "$moe_run" -m m --preset edgemoe -p "Hello world" -n 2 --temp 0 --no-direct \
    --routing-trace t.mktrace
  grep -q "held out" "$root/out" || fail "the calibration does not say it is held out: $(tail -c 400 "$root/out")"
}

if ! declare -F "case_$case_name" >/dev/null; then
  echo "unknown case '$case_name'"
  exit 2
fi
"case_$case_name"
if [[ $failures -ne 0 ]]; then
  echo "$case_name: $failures check(s) failed"
  exit 1
fi
echo "$case_name: passed"
