# The CUDA kernels: one static library, with the target architectures set per
# source file. Ampere-class kernels (src/cuda/*.cu, src/cuda/sm80/) are built
# for every architecture in FLASHCORE_CUDA_ARCHS; Hopper kernels (src/cuda/sm90/)
# only for 90a, because wgmma/setmaxnreg exist only there.
set(FC_SM80_GENCODE "")
set(FC_SM90_GENCODE "")
set(FC_COMPILED_ARCHS "")
foreach(a IN LISTS FLASHCORE_CUDA_ARCHS)
  if(a STREQUAL "90a")
    list(APPEND FC_SM80_GENCODE "-gencode=arch=compute_90a,code=sm_90a")
    list(APPEND FC_SM90_GENCODE "-gencode=arch=compute_90a,code=sm_90a")
  elseif(a MATCHES "^(80|86|87|89|90)$")
    list(APPEND FC_SM80_GENCODE "-gencode=arch=compute_${a},code=sm_${a}")
  else()
    message(FATAL_ERROR "FLASHCORE_CUDA_ARCHS: unsupported architecture '${a}' (use 80, 86, 89, 90, 90a)")
  endif()
  list(APPEND FC_COMPILED_ARCHS "${a}")
endforeach()
string(REPLACE ";" "," FC_COMPILED_ARCHS_STR "${FC_COMPILED_ARCHS}")

file(GLOB FC_CUDA_COMMON_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu
                                                  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/*.cu)
file(GLOB FC_CUDA_SM90_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/*.cu)
# The Hopper table's row list is host code that tools need in every build.
set(FC_CUDA_SM90_ROWS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/tile_rows.cu)
list(REMOVE_ITEM FC_CUDA_SM90_SOURCES ${FC_CUDA_SM90_ROWS})
list(APPEND FC_CUDA_COMMON_SOURCES ${FC_CUDA_SM90_ROWS})
file(GLOB FC_CUDA_HOST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.c)

set(FC_KERNEL_SOURCES ${FC_CUDA_COMMON_SOURCES})
set(FC_HAVE_SM90 0)
if(FC_SM90_GENCODE AND FC_CUDA_SM90_SOURCES)
  list(APPEND FC_KERNEL_SOURCES ${FC_CUDA_SM90_SOURCES})
  set(FC_HAVE_SM90 1)
endif()

add_library(fc_cuda_kernels STATIC ${FC_KERNEL_SOURCES} ${FC_CUDA_HOST_SOURCES})
set_target_properties(fc_cuda_kernels PROPERTIES CUDA_ARCHITECTURES OFF
  POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
  C_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
target_include_directories(fc_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src
  ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_link_libraries(fc_cuda_kernels PRIVATE CUDA::cudart_static)
target_compile_definitions(fc_cuda_kernels PRIVATE FC_HAVE_CUDA=1 FC_HAVE_SM90=${FC_HAVE_SM90}
  FC_COMPILED_ARCHS="${FC_COMPILED_ARCHS_STR}")
# Spills in shipped kernels are bugs: ptxas reports them on every build.
target_compile_options(fc_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=--warn-on-spills --expt-relaxed-constexpr -lineinfo>)
foreach(src IN LISTS FC_CUDA_COMMON_SOURCES)
  set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FC_SM80_GENCODE}")
endforeach()
foreach(src IN LISTS FC_CUDA_SM90_SOURCES)
  set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FC_SM90_GENCODE}")
endforeach()
