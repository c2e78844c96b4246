# The package test (ctest: Package.ConsumerBuildsAndRunsAgainstTheInstalledPackage): installs this
# build into a fresh prefix, configures examples/consumer/ against it with nothing but
# find_package(pipetrain REQUIRED), builds it and runs every program; each checks its own result
# and exits non-zero when the check fails. PYTHON (torch's interpreter, the build's
# PIPETRAIN_PYTHON) writes the TorchScript model torchscript_stages trains, and with transformers
# the Hugging Face model hf_llama and job train (where transformers cannot be imported, those two
# programs are built but not run, and the output says so).
#
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DPYTHON=... -P cmake/TestConsumer.cmake
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR PYTHON)
  if(NOT ${var})
    message(FATAL_ERROR "TestConsumer.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${what} failed (${result})")
  endif()
endfunction()

run_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run_step("configure the consumer" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples/consumer"
         -B "${WORK_DIR}/build" -G Ninja "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
         -DCMAKE_BUILD_TYPE=Release)
run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
set(consumer "${SOURCE_DIR}/examples/consumer")
set(programs "${WORK_DIR}/build")
run_step("run two_stage_1f1b" "${programs}/two_stage_1f1b")
run_step("run two_processes" "${programs}/two_processes")
run_step("save the TorchScript model" "${PYTHON}" "${consumer}/save_scripted_model.py"
         "${WORK_DIR}/scripted.pt")
run_step("run torchscript_stages" "${programs}/torchscript_stages" "${WORK_DIR}/scripted.pt")
# save_hf_llama.py exits 3 where transformers cannot be imported (one Python start, not a probe
# and then the script).
execute_process(COMMAND "${PYTHON}" "${consumer}/save_hf_llama.py" "${WORK_DIR}/tiny-llama"
                RESULT_VARIABLE saved OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "save the Hugging Face model:\n${out}${err}")
if(saved EQUAL 3)
  message(STATUS "hf_llama and job built, not run: ${PYTHON} cannot import transformers")
elseif(NOT saved EQUAL 0)
  message(FATAL_ERROR "save the Hugging Face model failed (${saved})")
else()
  run_step("run hf_llama" "${programs}/hf_llama" "${WORK_DIR}/tiny-llama"
           "${WORK_DIR}/trained-llama")
  run_step("check hf_llama's output with transformers" "${PYTHON}" "${consumer}/save_hf_llama.py"
           --check "${WORK_DIR}/tiny-llama" "${WORK_DIR}/trained-llama")
  run_step("run job" "${programs}/job" "${WORK_DIR}/tiny-llama" "${WORK_DIR}/job"
           "${WORK_DIR}/prefix/bin/pipetrain")
endif()
run_step("run custom_schedule" "${programs}/custom_schedule")
run_step("run plan_and_train" "${programs}/plan_and_train")
run_step("run schedule_only" "${programs}/schedule_only")
file(REMOVE_RECURSE "${WORK_DIR}")
