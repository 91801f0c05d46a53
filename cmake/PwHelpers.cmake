# pw_tests_need(<label> <targets...>): the tests labelled <label> run these targets. The sanitizer
# trees build only what they run: the targets unit-tests and tsan-tests (the top-level
# CMakeLists.txt) depend on what was declared here for `unit` and `tsan` (pw_add_gtest declares
# its own binary; a test that runs other binaries declares them too).
function(pw_tests_need label)
  set_property(GLOBAL APPEND PROPERTY PW_${label}_TEST_TARGETS ${ARGN})
endfunction()

# pw_compute_folder(): this folder does a model's arithmetic (kernels, engine, quantizer): in a
# sanitizer tree its code keeps -O1 where the rest of the ASan+UBSan tree is -O0.
function(pw_compute_folder)
  if(PW_SANITIZE)
    add_compile_options(-O1)
  endif()
endfunction()

# pw_add_gtest(<name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>])
# Builds a GoogleTest binary into build/bin and registers each test case with CTest.
# Label `unit` marks tests that also run under ASan+UBSan (fast, single-process); `tsan` the
# concurrent parts run under ThreadSanitizer (make test-tsan).
# ENV: VAR=VALUE pairs every test of the binary runs with (PW_BF16_ACTIVATIONS=0: the exact
# activations the checks against HF transformers need).
function(pw_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    PW_SOURCE_DIR="${CMAKE_SOURCE_DIR}" PW_BINARY_DIR="${CMAKE_BINARY_DIR}")
  # gtest_discover_tests flattens a list-valued property, so several labels are joined into one
  # ("unit+tsan"); `ctest -L <regex>` matches a part of it (-L unit, -L tsan).
  foreach(label unit tsan)
    if(label IN_LIST ARG_LABELS)
      pw_tests_need(${label} ${name})
    endif()
  endforeach()
  list(JOIN ARG_LABELS "+" labels)
  set(env_property)
  if(ARG_ENV)
    set(env_property ENVIRONMENT "${ARG_ENV}")
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
    PROPERTIES LABELS "${labels}" ${env_property}
    DISCOVERY_TIMEOUT 60)
endfunction()

# Compiles the listed sources of a target for a SIMD level (run-time dispatch picks the path).
function(pw_simd_sources level)
  if(level STREQUAL "avx2")
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  elseif(level STREQUAL "avx512")
    # Only what the run-time check (avx512f, avx512bw, avx512vl; dq on every such CPU) ensures:
    # extensions beyond it could be emitted by the compiler and fault on CPUs without them.
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mfma;-mf16c;-mavx2")
  elseif(level STREQUAL "avx512q8")
    # The integer fast path: AVX-512 F/BW/VL/DQ with VNNI (vpdpbusd), VBMI (vpermb/vpermi2b)
    # and GFNI (vgf2p8affineqb).
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512vbmi;-mgfni;-mfma;-mf16c;-mavx2")
  endif()
endfunction()
