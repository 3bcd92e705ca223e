# launch.cmake - hpdlrun --sbatch and --k8s (docs/runtime.md, "Clusters:
# SLURM and Kubernetes"): golden tests of the sbatch script and the Kubeflow
# MPIJob of gpt2-tiny at several layouts, the error messages, --submit with
# a stand-in sbatch, and the MPIJobs validated against our description of the
# MPI operator's v2beta1 API (tests/launch/mpijob_api.py; python3-yaml), a
# broken one refused. Label: launch.
find_package(Python3 COMPONENTS Interpreter)
set(HPDL_LAUNCH_CASES sbatch_one_rank sbatch_dp2_tp2 sbatch_uneven k8s_one_rank k8s_dp2_tp2 k8s_schema_rejects odd_strings mpirun_one_rank errors submit)
foreach(case ${HPDL_LAUNCH_CASES})
  if(Python3_Interpreter_FOUND)
    # skips (77) without yaml: scripts/setup.sh installs it
    add_test(NAME launch.${case}
             COMMAND bash -c "\"$0\" -c 'import yaml' 2>/dev/null || { echo 'skipped: python3-yaml (scripts/setup.sh)'; exit 77; }; exec \"$0\" \"$@\""
                     ${Python3_EXECUTABLE} ${HPDL_TEST_DIR}/launch/launch_test.py --bin ${CMAKE_BINARY_DIR}/bin
                     --work ${CMAKE_CURRENT_BINARY_DIR}/launch/${case} ${case})
  else()
    add_test(NAME launch.${case} COMMAND bash -c "echo 'skipped: no python3'; exit 77")
  endif()
  set_tests_properties(launch.${case} PROPERTIES LABELS launch TIMEOUT 120 SKIP_RETURN_CODE 77)
endforeach()

# SLURM end to end (tests/launch/slurm_e2e.sh): munged, slurmctld and slurmd
# on this machine, the sbatch script of gpt2-tiny on 2 CPU ranks submitted,
# its losses read; then the time limit's signal: checkpoint, requeue, resume.
# Skips (77) where the daemons cannot start (not root, no slurm-wlm / munge).
add_test(NAME launch.slurm_e2e COMMAND bash ${HPDL_TEST_DIR}/launch/slurm_e2e.sh ${CMAKE_BINARY_DIR}/bin
         ${CMAKE_CURRENT_BINARY_DIR}/launch/slurm_e2e)
# not in the sanitizer run (sanitize_redundant): what it adds to the other
# launch cases is SLURM's daemons, not code of ours
set_tests_properties(launch.slurm_e2e PROPERTIES LABELS "launch;sanitize_redundant" TIMEOUT 240 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
