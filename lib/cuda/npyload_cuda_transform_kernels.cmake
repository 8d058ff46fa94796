# Device transform kernels (included from lib/CMakeLists.txt), part of
# lib/cuda. With nvcc: npyload_cuda_transform_kernels.cu -> a fatbin (SASS
# for sm_80 and sm_90, and PTX for the oldest architecture the toolkit
# supports, which the driver JIT-compiles for any other GPU: sm_75, sm_100,
# sm_120...) embedded as a byte array in a generated header, and a PTX file
# that ctest assembles with ptxas. Without nvcc the library builds without
# them and device transforms report so at plan time.
set(NPYLOAD_HAVE_TRANSFORM_KERNELS OFF)
if(NPYLOAD_HAVE_NVCC)
  set(_tk_src ${CMAKE_CURRENT_SOURCE_DIR}/cuda/npyload_cuda_transform_kernels.cu)
  set(_tk_params ${CMAKE_CURRENT_SOURCE_DIR}/cuda/npyload_cuda_transform_kparams.h)
  set(_tk_embed ${CMAKE_CURRENT_SOURCE_DIR}/cuda/npyload_cuda_transform_embed.cmake)
  set(_tk_dir ${CMAKE_CURRENT_BINARY_DIR}/cuda)
  set(_tk_out ${_tk_dir}/npyload_cuda_transform_kernels)
  file(MAKE_DIRECTORY ${_tk_dir})
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    set(_tk_low 75)   # CUDA 13 dropped sm_70
  else()
    set(_tk_low 70)
  endif()
  set(_tk_flags -std=c++14 -O3 -I${CMAKE_CURRENT_SOURCE_DIR}/cuda)
  # SASS for these, PTX for _tk_low; the list also goes into the library
  # (npyl_tdev_archs, for npyload_get_build_info).
  set(_tk_sass 80 90)
  set(_tk_gencode "")
  set(_tk_archs "")
  foreach(a IN LISTS _tk_sass)
    list(APPEND _tk_gencode -gencode arch=compute_${a},code=sm_${a})
    string(APPEND _tk_archs "sm_${a} ")
  endforeach()
  list(APPEND _tk_gencode -gencode arch=compute_${_tk_low},code=compute_${_tk_low})
  string(APPEND _tk_archs "compute_${_tk_low}")
  add_custom_command(
    OUTPUT ${_tk_out}.fatbin
    COMMAND ${CMAKE_CUDA_COMPILER} ${_tk_flags} -fatbin ${_tk_gencode}
            ${_tk_src} -o ${_tk_out}.fatbin
    DEPENDS ${_tk_src} ${_tk_params}
    COMMENT "nvcc: device transform kernels (fatbin)")
  add_custom_command(
    OUTPUT ${_tk_out}.ptx
    COMMAND ${CMAKE_CUDA_COMPILER} ${_tk_flags} -ptx -arch=compute_80
            ${_tk_src} -o ${_tk_out}.ptx
    DEPENDS ${_tk_src} ${_tk_params}
    COMMENT "nvcc: device transform kernels (PTX, for the ptxas check)")
  add_custom_command(
    OUTPUT ${_tk_out}_fatbin.h
    COMMAND ${CMAKE_COMMAND} -DIN=${_tk_out}.fatbin -DOUT=${_tk_out}_fatbin.h
            -P ${_tk_embed}
    DEPENDS ${_tk_out}.fatbin ${_tk_embed}
    COMMENT "embedding the device transform kernels")
  add_custom_target(npyload_cuda_transform_kernels
    DEPENDS ${_tk_out}_fatbin.h ${_tk_out}.ptx)
  add_dependencies(npyload_cuda npyload_cuda_transform_kernels)
  set_source_files_properties(cuda/npyload_cuda_transform.c PROPERTIES
    OBJECT_DEPENDS ${_tk_out}_fatbin.h)
  target_include_directories(npyload_cuda PRIVATE ${_tk_dir})
  target_compile_definitions(npyload_cuda PRIVATE NPYLOAD_HAVE_TRANSFORM_KERNELS=1
    NPYLOAD_TRANSFORM_KERNEL_ARCHS="${_tk_archs}")
  set(NPYLOAD_HAVE_TRANSFORM_KERNELS ON)
  set(NPYLOAD_TRANSFORM_PTX ${_tk_out}.ptx PARENT_SCOPE)
endif()
set(NPYLOAD_HAVE_TRANSFORM_KERNELS ${NPYLOAD_HAVE_TRANSFORM_KERNELS} PARENT_SCOPE)
