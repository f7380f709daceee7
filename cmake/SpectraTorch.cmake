# Finds LibTorch (from the pip-installed torch package) for the LibTorch targets.
# Included from the top level: Torch's imported targets are directory-scoped, and
# runtime/, models/ and test/ all use them.
set(SPECTRA_TORCH_HINT
  "LibTorch was not found. Spectra's runtime needs it: run ./spectra setup (it runs "
  "'pip install torch'), or point CMAKE_PREFIX_PATH at torch's cmake dir "
  "(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'), or configure "
  "with -DSPECTRA_ENABLE_TORCH=OFF to build the compiler alone.")
if(NOT Torch_DIR)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
    endif()
  endif()
endif()
# TorchConfig probes CUDA; the CPU build machines have the toolkit but no GPU, which is fine.
find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "${SPECTRA_TORCH_HINT}")
endif()
message(STATUS "Spectra: LibTorch ${Torch_VERSION} from ${Torch_DIR}")


# Torch's flags, not LLVM's: LLVM builds with -fno-rtti/-fno-exceptions, LibTorch needs both.
# at::parallel_for is header code: with torch's OpenMP backend (AT_PARALLEL_OPENMP) it is a
# `#pragma omp parallel` compiled into our objects, so they need -fopenmp; without it every
# parallel_for silently runs on one thread. libgomp resolves by soname to torch's own copy.
function(spectra_torch_target target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(${target} PRIVATE -frtti -fexceptions -fopenmp)
  target_link_options(${target} PUBLIC -fopenmp)
endfunction()
