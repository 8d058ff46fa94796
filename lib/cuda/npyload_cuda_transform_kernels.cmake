# Device transform kernels (included from lib/CMakeLists.txt), part of
# lib/cuda, shaped by NPYLOAD_CUDA_KERNELS (the top CMakeLists.txt):
#  - the source (npyload_cuda_transform_kernels.cu and the two headers it
#    includes under NVRTC) is embedded as text whenever the option is not
#    OFF: npyload_cuda_nvrtc.c compiles it at run time with NVRTC when no
#    ahead-of-time image covers the GPU. One source for both paths.
#  - with nvcc (AUTO, AOT): the same .cu -> a fatbin (SASS for sm_80 and
#    sm_90, and PTX for the oldest architecture the toolkit supports, which
#    the driver JIT-compiles for any other GPU: sm_75, sm_100, sm_120...)
#    embedded as a byte array in a generated header, and a PTX file that
#    ctest assembles with ptxas.
# OFF: neither, and device transforms report so at plan time.
set(NPYLOAD_HAVE_TRANSFORM_KERNELS OFF)
set(NPYLOAD_HAVE_TRANSFORM_SOURCE OFF)
set(_tk_cdir ${CMAKE_CURRENT_SOURCE_DIR}/cuda)
set(_tk_src ${_tk_cdir}/npyload_cuda_transform_kernels.cu)
set(_tk_params ${_tk_cdir}/npyload_cuda_transform_kparams.h)
set(_tk_rtc ${_tk_cdir}/npyload_cuda_transform_rtc.h)
set(_tk_embed ${_tk_cdir}/npyload_cuda_transform_embed.cmake)
set(_tk_dir ${CMAKE_CURRENT_BINARY_DIR}/cuda)
set(_tk_out ${_tk_dir}/npyload_cuda_transform_kernels)
file(MAKE_DIRECTORY ${_tk_dir})
set(_tk_headers "")
if(NOT NPYLOAD_CUDA_KERNELS STREQUAL "OFF")
  # name in the library, file: the source and the headers NVRTC is given
  foreach(_pair "npyl_tk_src_cu|${_tk_src}" "npyl_tk_src_kparams|${_tk_params}"
                "npyl_tk_src_rtc|${_tk_rtc}")
    string(REPLACE "|" ";" _pair "${_pair}")
    list(GET _pair 0 _name)
    list(GET _pair 1 _file)
    add_custom_command(
      OUTPUT ${_tk_dir}/${_name}.h
      COMMAND ${CMAKE_COMMAND} -DIN=${_file} -DOUT=${_tk_dir}/${_name}.h
              -DNAME=${_name} -DTEXT=1 -P ${_tk_embed}
      DEPENDS ${_file} ${_tk_embed}
      COMMENT "embedding the device transform kernels' source (${_name})")
    list(APPEND _tk_headers ${_tk_dir}/${_name}.h)
  endforeach()
  set_source_files_properties(cuda/npyload_cuda_nvrtc.c PROPERTIES
    OBJECT_DEPENDS "${_tk_dir}/npyl_tk_src_cu.h;${_tk_dir}/npyl_tk_src_kparams.h;${_tk_dir}/npyl_tk_src_rtc.h")
  target_compile_definitions(npyload_cuda PRIVATE NPYLOAD_HAVE_TRANSFORM_SOURCE=1)
  set(NPYLOAD_HAVE_TRANSFORM_SOURCE ON)
endif()
if(NPYLOAD_HAVE_NVCC AND NPYLOAD_CUDA_KERNELS MATCHES "^(AUTO|AOT)$")
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    set(_tk_low 75)   # CUDA 13 dropped sm_70
  else()
    set(_tk_low 70)
  endif()
  set(_tk_flags -std=c++14 -O3 -I${_tk_cdir})
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
            -DNAME=npyl_tk_fatbin -P ${_tk_embed}
    DEPENDS ${_tk_out}.fatbin ${_tk_embed}
    COMMENT "embedding the device transform kernels")
  list(APPEND _tk_headers ${_tk_out}_fatbin.h ${_tk_out}.ptx)
  set_source_files_properties(cuda/npyload_cuda_transform.c PROPERTIES
    OBJECT_DEPENDS ${_tk_out}_fatbin.h)
  target_compile_definitions(npyload_cuda PRIVATE NPYLOAD_HAVE_TRANSFORM_KERNELS=1
    NPYLOAD_TRANSFORM_KERNEL_ARCHS="${_tk_archs}")
  set(NPYLOAD_HAVE_TRANSFORM_KERNELS ON)
  set(NPYLOAD_TRANSFORM_PTX ${_tk_out}.ptx PARENT_SCOPE)
endif()
if(_tk_headers)
  add_custom_target(npyload_cuda_transform_kernels DEPENDS ${_tk_headers})
  add_dependencies(npyload_cuda npyload_cuda_transform_kernels)
  target_include_directories(npyload_cuda PRIVATE ${_tk_dir})
endif()
set(NPYLOAD_HAVE_TRANSFORM_KERNELS ${NPYLOAD_HAVE_TRANSFORM_KERNELS} PARENT_SCOPE)
set(NPYLOAD_HAVE_TRANSFORM_SOURCE ${NPYLOAD_HAVE_TRANSFORM_SOURCE} PARENT_SCOPE)
