# npyload_bench_core: npyload-bench's pure logic, a static library of the
# build tree (never installed), included by tools/CMakeLists.txt and, when
# the tools are not built, by tests/CMakeLists.txt: percentiles and the
# recommendation, the JSON and text reports, the SVG plot, the build-info
# block and its JSON (npyload_info_print.c), the part
# tests/test_bench_report.c unit-tests. Public header only.
set(_t ${PROJECT_SOURCE_DIR}/tools)
if(TARGET npyload_bench_core)
  return()
endif()
add_library(npyload_bench_core STATIC ${_t}/npyload_bench_recommend.c
            ${_t}/npyload_bench_report.c ${_t}/npyload_bench_zst_report.c
            ${_t}/npyload_bench_plot.c ${_t}/npyload_json.c ${_t}/npyload_info_print.c)
target_include_directories(npyload_bench_core PUBLIC ${_t})
target_compile_definitions(npyload_bench_core PUBLIC NPYLOAD_EXPERIMENTAL)
target_link_libraries(npyload_bench_core PUBLIC npyload_static m)
