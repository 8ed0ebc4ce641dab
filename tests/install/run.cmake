# Install this build into a scratch prefix, then build the consumer against
# it twice: once with find_package(sluice), once with pkg-config.
#   -DBUILD_DIR=<sluice build> -DSOURCE_DIR=<tests/install> -DWORK_DIR=<scratch>
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/consumer -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)

# pkg-config: what a Makefile-based embedder would use.
set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
execute_process(COMMAND pkg-config --cflags --libs sluice-core OUTPUT_VARIABLE flags
  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config cannot find sluice-core in ${prefix}/share/pkgconfig")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(cc -std=c11 ${SOURCE_DIR}/consumer.c -o ${WORK_DIR}/consumer-pc ${flags})
run(${WORK_DIR}/consumer-pc)
message(STATUS "find_package(sluice) and pkg-config sluice-core both work")
