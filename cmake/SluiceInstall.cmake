# Install rules: headers, exported targets for find_package(sluice)
# (sluice::core and, when built, sluice::shim), the package config and
# version files, a pkg-config file per target, and the tools.
include(CMakePackageConfigHelpers)

set(SLUICE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
set(SLUICE_HAS_SHIM OFF)
if(TARGET sluice_shim)
  set(SLUICE_HAS_SHIM ON)
endif()

install(DIRECTORY include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS sluice_core EXPORT sluiceTargets)
if(SLUICE_HAS_SHIM)
  install(DIRECTORY shim/include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS sluice_shim EXPORT sluiceTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # The tools; sluice-demo finds the simulator next to itself.
  foreach(tool sluicectl sluice-provider-sim sluice-demo sluice-proxy)
    if(TARGET ${tool})
      install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    endif()
  endforeach()
endif()
install(EXPORT sluiceTargets NAMESPACE sluice:: FILE sluiceTargets.cmake
  DESTINATION ${SLUICE_CMAKE_DIR})

configure_package_config_file(cmake/sluiceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sluiceConfig.cmake
  INSTALL_DESTINATION ${SLUICE_CMAKE_DIR})
# The core alone is headers, the same for every architecture; a compiled
# shim is not.
if(SLUICE_HAS_SHIM)
  set(arch_independent "")
else()
  set(arch_independent ARCH_INDEPENDENT)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ${arch_independent})
install(FILES ${PROJECT_BINARY_DIR}/sluiceConfig.cmake ${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  DESTINATION ${SLUICE_CMAKE_DIR})

# pkg-config: `sluice` is the core (sluice-core, the target's own name, is
# an alias of it), `sluice-shim` the shim. Each file finds the prefix
# relative to where it is installed, so an installed tree can be moved.
# All of them go to LIBDIR/pkgconfig, so one PKG_CONFIG_PATH finds
# sluice-shim and the sluice it requires (the core's flags are not
# architecture-independent anyway: ck's library is).
# The core lists ck's flags itself instead of `Requires: ck`: ck.pc's Cflags
# carry -D__x86_64__, which a consumer's compiler defines on its own (and
# which would be wrong under -m32 or a cross compiler). pkg-config drops the
# system directories from these flags as from any other.
set(SLUICE_PC_CK_CFLAGS "-I${CK_INCLUDEDIR}")
set(SLUICE_PC_CK_LIBS "-L${CK_LIBDIR} -lck")
function(sluice_pkg_config name dir)
  file(RELATIVE_PATH to_prefix /prefix/${dir} /prefix)
  string(REGEX REPLACE "/$" "" SLUICE_PC_PREFIX "\${pcfiledir}/${to_prefix}")
  configure_file(cmake/${name}.pc.in ${PROJECT_BINARY_DIR}/${name}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${name}.pc DESTINATION ${dir})
endfunction()
sluice_pkg_config(sluice ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
sluice_pkg_config(sluice-core ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(SLUICE_HAS_SHIM)
  # A static libsluice-shim needs its private dependencies on the link line
  # too; a shared one carries them itself.
  get_target_property(shim_type sluice_shim TYPE)
  set(SLUICE_PC_HIREDIS "")
  if(SLUICE_WITH_FLEET)
    set(SLUICE_PC_HIREDIS " hiredis")
  endif()
  if(shim_type STREQUAL "STATIC_LIBRARY")
    set(SLUICE_PC_SHIM_REQUIRES "sluice libcurl jansson libmicrohttpd${SLUICE_PC_HIREDIS}")
    set(SLUICE_PC_SHIM_REQUIRES_PRIVATE "")
  else()
    set(SLUICE_PC_SHIM_REQUIRES "sluice libcurl")
    set(SLUICE_PC_SHIM_REQUIRES_PRIVATE "jansson libmicrohttpd${SLUICE_PC_HIREDIS}")
  endif()
  sluice_pkg_config(sluice-shim ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
