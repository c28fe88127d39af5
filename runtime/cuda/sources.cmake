# The CUDA backend's sources, shared by the real build (runtime/cuda/CMakeLists.txt) and the
# CPU-emulated build of the GPU tests (tests/gpu/CMakeLists.txt).
set(SBPRT_CUDA_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(SBPRT_CUDA_C_SOURCES "${SBPRT_CUDA_DIR}/ctx.c")
set(SBPRT_CUDA_CU_SOURCES)
foreach(unit gemm elementwise norm embedding rope attention loss objectives optim extra docs
             seqpar moe)
  list(APPEND SBPRT_CUDA_CU_SOURCES "${SBPRT_CUDA_DIR}/${unit}.cu")
endforeach()

# Options added with add_compile_options() above the calling directory (-Wall -Wextra, the
# sanitizers) are GCC/Clang options that nvcc rejects.  Limit them to C and C++ in the calling
# directory; CUDA sources get their host-compiler warnings through -Xcompiler instead.
function(sbprt_cuda_scope_compile_options)
  get_property(opts DIRECTORY PROPERTY COMPILE_OPTIONS)
  set(scoped)
  foreach(opt IN LISTS opts)
    string(REPLACE "," "$<COMMA>" opt "${opt}")
    list(APPEND scoped "$<$<COMPILE_LANGUAGE:C,CXX>:${opt}>")
  endforeach()
  set_property(DIRECTORY PROPERTY COMPILE_OPTIONS "${scoped}")
endfunction()
