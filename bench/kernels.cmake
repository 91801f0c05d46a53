# pw-bench-kernels: any-precision kernels vs dense bf16 vs memory read (Google Benchmark).
# Included by bench/CMakeLists.txt when present.
if(PW_BUILD_BENCH AND TARGET pw_anyprec_quant AND TARGET pw_kernels_cpu)
  add_executable(pw-bench-kernels ${CMAKE_CURRENT_LIST_DIR}/kernels_bench.cc)
  target_link_libraries(pw-bench-kernels PRIVATE pw_anyprec_quant pw_kernels_anyprec pw_kernels_cpu
    pw_bench_bandwidth benchmark::benchmark)
endif()
