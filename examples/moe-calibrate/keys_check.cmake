# Runs moe-calibrate on a tiny expert and checks the keys it writes for moe-sim: the link's reads
# in flight, the CPU-only engine flags, and what was timed (activations and layout per precision).
# -DCALIBRATE=<binary> -DCONVERT=<moe-convert> -DMODEL=<default model directory>
# -DDIR=<scratch directory on a disk>
set(out "${DIR}/moe-calibrate-keys.json")
execute_process(
  COMMAND "${CALIBRATE}" --out "${out}" --force --disk-dir "${DIR}" --disk-size 4MiB --reps 3
          --hidden 64 --ffn 64 --threads 1 --io-threads 3 --activations f32 --expert-layout panels
          --slope-precision f16
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-calibrate failed (${rc}):\n${stdout}\n${stderr}")
endif()
file(READ "${out}" json)
file(REMOVE "${out}")
function(expect want)
  string(JSON got ERROR_VARIABLE err GET "${json}" ${ARGN})
  if(err OR NOT "${got}" STREQUAL "${want}")
    message(FATAL_ERROR "moe-calibrate wrote ${ARGN} = '${got}' (${err}), expected '${want}':\n${json}")
  endif()
endfunction()
expect(3 link reads_in_flight)  # a store: one read per --io-threads
expect(0.0 link read_bandwidth_bytes_per_s)  # no --checkpoint: the raw read is one reader's
expect(0.0 link compute_s_per_byte)  # ... and no loader's CPU time is measured
expect(OFF host_holds_experts)
expect(ON host_is_device)
expect(ON experts_after_all_loads)
expect(ON fixed_includes_first_token)
expect(1 timed threads)
expect(f32 timed activations q4)
expect(panels timed layout q4)
expect(rows timed layout f16)
expect(f32 timed activations f16)
string(JSON solo ERROR_VARIABLE no_solo GET "${json}" solo)
if(NOT no_solo)
  message(FATAL_ERROR "moe-calibrate --threads 1 wrote one-thread rates (\"solo\"):\n${json}")
endif()

# More than one thread: the one-thread rates beside them, and the decode steps' share on all.
execute_process(
  COMMAND "${CALIBRATE}" --out "${out}" --force --disk-dir "${DIR}" --disk-size 4MiB --reps 3
          --hidden 64 --ffn 64 --threads 2 --activations f32 --expert-layout panels
          --slope-precision f16 --decode-team-fraction 0.25
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-calibrate --threads 2 failed (${rc}):\n${stdout}\n${stderr}")
endif()
file(READ "${out}" json)
file(REMOVE "${out}")
expect(2 timed threads)
expect(0.25 decode_team_fraction)
string(JSON q4 ERROR_VARIABLE err GET "${json}" solo weight_bytes_per_s q4)
if(err OR NOT q4 GREATER 0)
  message(FATAL_ERROR "moe-calibrate --threads 2 wrote no solo q4 rate (${err}):\n${json}")
endif()

# A checkpoint and a store of it: the store's loader is the second read path, the checkpoint's
# own precision the one read in place.
set(store "${DIR}/moe-calibrate-keys-q2.moestore")
execute_process(
  COMMAND "${CONVERT}" -m "${MODEL}" -o "${store}" --precisions q2 --force
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-convert failed (${rc}):\n${stdout}\n${stderr}")
endif()
execute_process(
  COMMAND "${CALIBRATE}" --out "${out}" --force --disk-dir "${DIR}" --disk-size 4MiB --reps 3
          --hidden 64 --ffn 64 --threads 1 --io-threads 3 --checkpoint "${MODEL}" --store "${store}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
file(REMOVE "${store}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-calibrate --store failed (${rc}):\n${stdout}\n${stderr}")
endif()
file(READ "${out}" json)
file(REMOVE "${out}")
expect(6 link reads_in_flight)  # the checkpoint: two reads per --io-threads
expect(3 link store reads_in_flight)  # the store: one
expect(bf16 link in_place)
string(JSON rate ERROR_VARIABLE err GET "${json}" link store bandwidth_bytes_per_s)
if(err OR NOT rate GREATER 0)
  message(FATAL_ERROR "moe-calibrate --store wrote no store rate (${err}):\n${json}")
endif()
# Each path's delay of the kernels per byte read: present, a number >= 0.
foreach(path "link" "link;store")
  string(JSON delay ERROR_VARIABLE err GET "${json}" ${path} compute_s_per_byte)
  if(err OR delay LESS 0)
    message(FATAL_ERROR "moe-calibrate --store wrote no ${path} compute_s_per_byte (${err}):\n${json}")
  endif()
endforeach()
message(STATUS "moe-calibrate keys: ok")
