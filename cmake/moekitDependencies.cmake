# Dependencies of the header-only library (all from Debian's packages; see scripts/install-deps.sh).
# The same list is found again by moekitConfig.cmake for consumers.
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED)                 # Boost.Lockfree (header-only)
find_package(nlohmann_json 3.10 REQUIRED)         # safetensors headers, store manifests
find_package(range-v3 REQUIRED)             # version file rejects ranges; Debian ships 0.12
find_package(PkgConfig QUIET)
set(MOEKIT_HAS_URING OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(URING QUIET IMPORTED_TARGET GLOBAL liburing)
  if(URING_FOUND)
    set(MOEKIT_HAS_URING ON)
  endif()
endif()
set(MOEKIT_INTERFACE_DEPENDENCIES Threads::Threads Boost::headers nlohmann_json::nlohmann_json
    range-v3::range-v3)
if(MOEKIT_HAS_URING)
  list(APPEND MOEKIT_INTERFACE_DEPENDENCIES PkgConfig::URING)
endif()
