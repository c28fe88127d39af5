# codegen/cuda.cmake — what `sbpc --target cuda -o step.so` links, recorded at configure time.
# Included from the SBP_CUDA block of the top-level CMakeLists.txt once runtime/cuda has
# defined sbprt_cuda (the code generator itself is defined earlier, before CUDA is enabled).
#
# A cuda step is C (compiled with $CC like a CPU step) linked against:
#   - the whole of libsbprt_cuda.a (--whole-archive): the step then exports every runtime
#     function, the optimizers and copies included, which sbp-train must take from the step
#     because the memory is the step's backend's device memory;
#   - the CUDA runtime and cuBLAS, shared, with an rpath to the toolkit's library folder;
#   - the C++ runtime, which the .cu files' host code needs (guards of function statics, the
#     exception personality), as CMake's CUDA link would add (CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES).
# The kernels are compiled into the library for CMAKE_CUDA_ARCHITECTURES (sm_90 with PTX by
# default): set it when configuring to build steps for other GPUs.
if(NOT TARGET sbpcodegen OR NOT TARGET sbprt_cuda)
  return()
endif()
find_package(CUDAToolkit REQUIRED)
set(_sbpcg_cuda_link
  "-Wl,--whole-archive" "$<TARGET_FILE:sbprt_cuda>" "-Wl,--no-whole-archive"
  "-L${CUDAToolkit_LIBRARY_DIR}" "-Wl,-rpath,${CUDAToolkit_LIBRARY_DIR}" -lcudart -lcublas)
set(_sbpcg_cxx stdc++)
foreach(lib IN LISTS CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES)
  if(lib MATCHES "^(stdc\\+\\+|c\\+\\+|c\\+\\+abi|gcc_s)$")
    list(APPEND _sbpcg_cxx "${lib}")
  endif()
endforeach()
list(REMOVE_DUPLICATES _sbpcg_cxx)
foreach(lib IN LISTS _sbpcg_cxx)
  list(APPEND _sbpcg_cuda_link "-l${lib}")
endforeach()
string(REPLACE ";" " " _sbpcg_cuda_link "${_sbpcg_cuda_link}")
target_compile_definitions(sbpcodegen PRIVATE "SBP_RT_CUDA_LINK=\"${_sbpcg_cuda_link}\""
                           "SBP_RT_CUDA_ARCHIVE=\"$<TARGET_FILE:sbprt_cuda>\"")
install(TARGETS sbprt_cuda ARCHIVE DESTINATION lib/sbpc) # for an installed sbpc (compile.c)
add_dependencies(sbpcodegen sbprt_cuda)
message(STATUS "sbpc --target cuda links: ${_sbpcg_cuda_link}")
