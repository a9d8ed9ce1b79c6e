# Provides the imported target specrpc::llama (llama + ggml public API) and the variable
# SPECRPC_LLAMA_LIB_DIR (where the ggml CPU variants live, for ggml_backend_load_all_from_path).
if(SPECRPC_SYSTEM_LLAMA)
  find_package(llama REQUIRED CONFIG)
  add_library(specrpc::llama INTERFACE IMPORTED)
  target_link_libraries(specrpc::llama INTERFACE llama)
  get_target_property(_llama_loc llama LOCATION)
  get_filename_component(SPECRPC_LLAMA_LIB_DIR "${_llama_loc}" DIRECTORY)
else()
  set(SPECRPC_LLAMA_DIR "${CMAKE_SOURCE_DIR}/deps/llama")
  if(NOT EXISTS "${SPECRPC_LLAMA_DIR}/include/llama.h")
    message(FATAL_ERROR "llama.cpp not found in ${SPECRPC_LLAMA_DIR}: run scripts/setup.sh first")
  endif()
  set(SPECRPC_LLAMA_LIB_DIR "${SPECRPC_LLAMA_DIR}/lib")
  add_library(specrpc::llama INTERFACE IMPORTED)
  target_include_directories(specrpc::llama SYSTEM INTERFACE "${SPECRPC_LLAMA_DIR}/include")
  target_link_libraries(specrpc::llama INTERFACE
    "${SPECRPC_LLAMA_LIB_DIR}/libllama.so" "${SPECRPC_LLAMA_LIB_DIR}/libggml.so"
    "${SPECRPC_LLAMA_LIB_DIR}/libggml-base.so")
endif()
# Binaries find the libraries without LD_LIBRARY_PATH.
set(CMAKE_BUILD_RPATH "${SPECRPC_LLAMA_LIB_DIR}")
set(CMAKE_INSTALL_RPATH "${SPECRPC_LLAMA_LIB_DIR}")
set(CMAKE_BUILD_WITH_INSTALL_RPATH OFF)
add_compile_definitions(SPECRPC_LLAMA_LIB_DIR="${SPECRPC_LLAMA_LIB_DIR}")
