# Shared helpers for the per-folder CMakeLists.

find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(GTest REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)

# peerserve_test(NAME SOURCES... [LIBS ...] [LABELS ...])
#   A GoogleTest executable registered with ctest. Tests labelled "unit" also run in the
#   sanitizer build; "slow" ones only in the regular build.
function(peerserve_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  # The code under test is the libraries' (-O2); the tests' own code is mostly gtest macros,
  # which compile faster at -O1 (all test objects: 616 CPU-s at -O2, 477 at -O1).
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    target_compile_options(${name} PRIVATE -O1)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
  set_tests_properties(${name} PROPERTIES ENVIRONMENT
    "PEERSERVE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PEERSERVE_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()

# peerserve_layer(NAME DEPS ... [PRIVATE_DEPS ...]): the library target peerserve_<NAME>
# built from every .cc under the current folder (so that several files can be added without
# editing this list). DEPS are what the layer's headers include (PUBLIC, so users get them
# too); PRIVATE_DEPS are used by its .cc files only. A folder with no sources yet becomes an
# INTERFACE target with the DEPS. Which layer may use which is README's layout table,
# checked by scripts/check_layers.py.
function(peerserve_layer name)
  cmake_parse_arguments(L "" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(sources)
    add_library(peerserve_${name} ${sources})
    target_link_libraries(peerserve_${name} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  else()
    add_library(peerserve_${name} INTERFACE)
    target_link_libraries(peerserve_${name} INTERFACE ${L_DEPS})
  endif()
endfunction()
