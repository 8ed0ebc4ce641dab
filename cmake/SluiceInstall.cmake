# Install rules: headers, exported targets for find_package(sluice), and a
# pkg-config file per target.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS sluice_core EXPORT sluiceTargets)
install(EXPORT sluiceTargets NAMESPACE sluice:: FILE sluiceTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)

configure_package_config_file(cmake/sluiceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sluiceConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/sluiceConfig.cmake ${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)

configure_file(cmake/sluice-core.pc.in ${PROJECT_BINARY_DIR}/sluice-core.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sluice-core.pc DESTINATION ${CMAKE_INSTALL_DATADIR}/pkgconfig)
