# Install this build into a scratch prefix, then build the consumers against
# it twice: once with find_package(sluice), once with pkg-config (sluice and
# sluice-shim), and run what was built.
#   -DBUILD_DIR=<sluice build> -DSOURCE_DIR=<tests/install> -DWORK_DIR=<scratch>
#   -DWITH_SHIM=ON|OFF -DLIBDIR=<CMAKE_INSTALL_LIBDIR>
#   -DC_FLAGS=<CMAKE_C_FLAGS> -DLINK_FLAGS=<CMAKE_EXE_LINKER_FLAGS>
# The consumers build with the build's own flags: a sanitizer build installs a
# sanitized libsluice-shim, which only links into sanitized programs.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# find_package(sluice) with sluice::core (and sluice::shim).
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/consumer -DCMAKE_PREFIX_PATH=${prefix}
    -DWITH_SHIM=${WITH_SHIM} "-DCMAKE_C_FLAGS=${C_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
if(WITH_SHIM)
  run(${WORK_DIR}/consumer/consumer_shim ${WORK_DIR}/state-cmake.json)
endif()

# pkg-config: what a Makefile-based embedder would use, with the one path the
# README gives (every sluice .pc is in $prefix/LIBDIR/pkgconfig).
set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
function(pkg_flags module out)
  execute_process(COMMAND pkg-config --cflags --libs ${module} OUTPUT_VARIABLE flags
    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config cannot use ${module} from $ENV{PKG_CONFIG_PATH}: ${err}")
  endif()
  # A consumer's compiler defines its own architecture macros; ck.pc's -D__x86_64__
  # must not reach it through sluice.
  if(flags MATCHES "-D__")
    message(FATAL_ERROR "pkg-config ${module} defines a reserved macro: ${flags}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${C_FLAGS} ${flags} ${LINK_FLAGS}")
  set(${out} ${flags} PARENT_SCOPE)
endfunction()
foreach(module sluice sluice-core)
  pkg_flags(${module} flags)
  run(cc -std=c11 ${SOURCE_DIR}/consumer.c -o ${WORK_DIR}/consumer-${module} ${flags})
  run(${WORK_DIR}/consumer-${module})
endforeach()
if(WITH_SHIM)
  pkg_flags(sluice-shim flags)
  run(cc -std=c11 ${SOURCE_DIR}/consumer_shim.c -o ${WORK_DIR}/consumer_shim-pc ${flags})
  run(${WORK_DIR}/consumer_shim-pc ${WORK_DIR}/state-pc.json)
endif()
message(STATUS "find_package(sluice) and pkg-config (sluice, sluice-core, sluice-shim: ${WITH_SHIM}) all work")
