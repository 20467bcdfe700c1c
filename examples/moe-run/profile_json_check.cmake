# ctest examples/moe-run-profile-json: `moe-run --profile --json` on the default model prints a
# "profile" object with every part of a decode token as a fraction in [0, 1] (their sum is checked
# by tests/engine/token_profile_test.cpp).  cmake -DMOE_RUN=... -P profile_json_check.cmake
execute_process(COMMAND ${MOE_RUN} -p "The history of the" -n 8 -t 2 --in-memory --profile --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-run failed (${rc}): ${err}")
endif()
string(JSON tokens GET "${out}" profile tokens)
if(tokens LESS 1)
  message(FATAL_ERROR "profile.tokens is ${tokens}, expected decode tokens")
endif()
foreach(part attention dense_matrices routing_pipeline experts lm_head sampling load_wait
             thread_sync other seconds_per_token)
  string(JSON v ERROR_VARIABLE missing GET "${out}" profile ${part})
  if(missing)
    message(FATAL_ERROR "moe-run --json has no profile.${part}: ${missing}")
  endif()
  if(v LESS 0 OR (NOT part STREQUAL "seconds_per_token" AND v GREATER 1))
    message(FATAL_ERROR "profile.${part} = ${v} is outside [0, 1]")
  endif()
endforeach()
string(JSON v GET "${out}" decode_steps_on_all_threads)
message(STATUS "profile fields present; decode_steps_on_all_threads ${v}")
