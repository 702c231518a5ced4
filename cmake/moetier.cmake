# moetier_module(NAME DEPS dep...): one static library per module from the
# sources in src/NAME (recursively, excluding *.cu unless CUDA is on).
function(moetier_warnings target)
  # `#pragma omp simd` is a vectorization hint only (no OpenMP runtime).
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp-simd>)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
  # GCC 12 at -O3 reports -Wrestrict false positives inside std::string
  # (GCC bug 105329); GCC 13 does not.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
  if(MOETIER_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

function(moetier_module name)
  cmake_parse_arguments(M "" "" "DEPS;SOURCES" ${ARGN})
  if(NOT M_SOURCES)
    file(GLOB_RECURSE M_SOURCES CONFIGURE_DEPENDS
         ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  endif()
  if(NOT M_SOURCES)  # a module whose sources are yet to come
    set(M_SOURCES ${CMAKE_CURRENT_BINARY_DIR}/empty_${name}.cpp)
    file(WRITE ${M_SOURCES} "// module ${name} has no sources yet\n")
  endif()
  add_library(moetier_${name} STATIC ${M_SOURCES})
  target_include_directories(moetier_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(moetier_${name} PUBLIC ${M_DEPS})
  moetier_warnings(moetier_${name})
endfunction()

macro(moetier_detect_cuda)
  set(MOETIER_HAVE_CUDA OFF)
  if(MOETIER_CUDA STREQUAL "AUTO")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(MOETIER_HAVE_CUDA ON)
    endif()
  elseif(MOETIER_CUDA)
    set(MOETIER_HAVE_CUDA ON)
  endif()
  if(MOETIER_HAVE_CUDA)
    # H100/H200 (sm_90), RTX 50 (sm_120), GB10 / DGX Spark (sm_121); pass
    # -DCMAKE_CUDA_ARCHITECTURES=90 for a faster build for one GPU.
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90;120;121")
    endif()
    # Programmatic dependent launch needs every kernel built for sm_90 or later
    # (kernels/cuda/launch.cuh): MOETIER_CUDA_MIN_ARCH is the lowest architecture
    # listed, 0 where one cannot be told ("native", "all"), and then PDL is not
    # asked for.
    set(_moetier_min_arch 0)
    foreach(_a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX MATCH "^[0-9]+" _n "${_a}")
      if(_n STREQUAL "")
        set(_moetier_min_arch -1)
        break()
      elseif(_moetier_min_arch EQUAL 0 OR _n LESS _moetier_min_arch)
        set(_moetier_min_arch ${_n})
      endif()
    endforeach()
    if(_moetier_min_arch LESS 0)
      set(_moetier_min_arch 0)
    endif()
    add_compile_definitions(MOETIER_CUDA_MIN_ARCH=${_moetier_min_arch})
    if(MOETIER_CUDA_TRACE)
      add_compile_definitions(MOETIER_CUDA_TRACE_BUILD=1)
    endif()
    if(MOETIER_CUDA_L2_PLAIN)
      add_compile_definitions(MOETIER_CUDA_L2_PLAIN=1)
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
  endif()
  message(STATUS "moetier: CUDA backend ${MOETIER_HAVE_CUDA}")
endmacro()
