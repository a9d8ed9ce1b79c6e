# llama.cpp, release v0.5.0, built from its pinned source by scripts/build_llama.sh into a cache
# outside the checkout; deps/llama-build points at it, deps/llama-tools at llama.cpp's tools
# (scripts/setup.sh makes the links).
#
# Provides:
#   specrpc::llama         llama + ggml public API (llama.h, ggml*.h)
#   specrpc::llama_common  llama.cpp's `common` library: Jinja chat templates, tool-call parsing,
#                          JSON schema to grammar (src/server/chat_templates.cpp only)
#   specrpc::ggml_rpc      ggml's RPC backend (a target split over rpc-server workers)
#   SPECRPC_LLAMA_LIB_DIR   where the shared libraries live
#   SPECRPC_LLAMA_BIN_DIR   llama.cpp's tools (llama-server, ggml-rpc-server, llama-lookup), for
#                          tests and benchmarks that compare against them
if(SPECRPC_SYSTEM_LLAMA)
  find_package(llama REQUIRED CONFIG)
  add_library(specrpc::llama INTERFACE IMPORTED)
  target_link_libraries(specrpc::llama INTERFACE llama)
  get_target_property(_llama_loc llama LOCATION)
  get_filename_component(SPECRPC_LLAMA_LIB_DIR "${_llama_loc}" DIRECTORY)
  message(FATAL_ERROR "SPECRPC_SYSTEM_LLAMA: a system llama.cpp does not install `common`; build from source instead")
endif()

set(SPECRPC_LLAMA_BUILD "${CMAKE_SOURCE_DIR}/deps/llama-build" CACHE PATH
    "llama.cpp built from source by scripts/build_llama.sh (its cache directory)")
get_filename_component(_llama_root "${SPECRPC_LLAMA_BUILD}" REALPATH)
if(NOT EXISTS "${_llama_root}/build/bin/libllama-common.so")
  message(FATAL_ERROR "llama.cpp not built at ${SPECRPC_LLAMA_BUILD}: run scripts/setup.sh first")
endif()
set(_llama_src "${_llama_root}/src")
set(SPECRPC_LLAMA_LIB_DIR "${_llama_root}/build/bin")
# llama.cpp's tools come from its default configuration (scripts/build_llama.sh tools)
set(SPECRPC_LLAMA_TOOLS "${CMAKE_SOURCE_DIR}/deps/llama-tools" CACHE PATH
    "llama.cpp's tools built by scripts/build_llama.sh tools (its cache directory)")
get_filename_component(_llama_tools "${SPECRPC_LLAMA_TOOLS}" REALPATH)
set(SPECRPC_LLAMA_BIN_DIR "${_llama_tools}/build/bin")

add_library(specrpc::llama INTERFACE IMPORTED)
target_include_directories(specrpc::llama SYSTEM INTERFACE "${_llama_src}/include" "${_llama_src}/ggml/include")
# libggml-cpu: the CPU thread pool's pause (ggml-cpu.h), which the backend registry does not offer.
target_link_libraries(specrpc::llama INTERFACE
  "${SPECRPC_LLAMA_LIB_DIR}/libllama.so" "${SPECRPC_LLAMA_LIB_DIR}/libggml.so"
  "${SPECRPC_LLAMA_LIB_DIR}/libggml-base.so" "${SPECRPC_LLAMA_LIB_DIR}/libggml-cpu.so")

add_library(specrpc::ggml_rpc INTERFACE IMPORTED)
target_link_libraries(specrpc::ggml_rpc INTERFACE "${SPECRPC_LLAMA_LIB_DIR}/libggml-rpc.so" specrpc::llama)

# `common` includes its vendored nlohmann::json (3.12) by <nlohmann/json.hpp>; only the bridge
# translation unit sees these include paths, so the rest of specrpc keeps Debian's.
add_library(specrpc::llama_common INTERFACE IMPORTED)
target_include_directories(specrpc::llama_common SYSTEM INTERFACE "${_llama_src}/common" "${_llama_src}/vendor")
target_link_libraries(specrpc::llama_common INTERFACE "${SPECRPC_LLAMA_LIB_DIR}/libllama-common.so" specrpc::llama)

# Binaries find the libraries without LD_LIBRARY_PATH.
set(CMAKE_BUILD_RPATH "${SPECRPC_LLAMA_LIB_DIR}")
set(CMAKE_INSTALL_RPATH "${SPECRPC_LLAMA_LIB_DIR}")
set(CMAKE_BUILD_WITH_INSTALL_RPATH OFF)
add_compile_definitions(SPECRPC_LLAMA_LIB_DIR="${SPECRPC_LLAMA_LIB_DIR}")
