# Dependency bootstrap: installs missing Debian packages with apt-get when
# running as root or with passwordless sudo; otherwise stops and prints the
# exact command. Only the presets enable it (SLUICE_BOOTSTRAP_DEPS=ON).

set(SLUICE_DEBIAN_PACKAGES
  gcc g++ make          # build: C11, the C++17 header check, the Makefile generator
  libck-dev             # core: Concurrency Kit
  pkg-config            # build: finds ck and the shim's libraries
  libcurl4-openssl-dev  # shim: transport
  libjansson-dev        # shim: state file and event JSON
  libmicrohttpd-dev     # shim: admin endpoint and provider simulator
  libmimalloc-dev       # sluice's programs: their allocator (never the library)
  libhiredis-dev        # shim: the Redis fleet (shared cap, leader lease, fleet permits)
  libconfig-dev         # sluice-proxy: its --config file (comments; errors name file, line, field)
)
# What only the tests, examples and bench need stays off a machine that only installs
# (the release preset turns them off; unset, they default on, as at the top level).
if(NOT DEFINED SLUICE_BUILD_TESTS OR SLUICE_BUILD_TESTS)
  list(APPEND SLUICE_DEBIAN_PACKAGES
    libcriterion-dev    # tests
    chromium            # tests: the admin endpoint's page in a headless browser (skipped without it)
    redis-server        # tests: the fleet's tests start their own server on loopback
    haproxy             # tests: a real queue-then-refuse gateway (maxconn + timeout queue) on loopback
    nodejs              # tests: the official OpenAI Node SDK as a real client of sluice-proxy
    openssl             # tests: a TLS upstream behind a private CA for sluice-proxy (s_server)
  )
  # Debian's nodejs ships npm separately; NodeSource's (a newer Node) includes it and
  # conflicts with Debian's npm package, so ask for npm only where no npm is found.
  find_program(SLUICE_NPM npm)
  if(NOT SLUICE_NPM)
    list(APPEND SLUICE_DEBIAN_PACKAGES npm)
  endif()
endif()
if(NOT DEFINED SLUICE_BUILD_EXAMPLES OR SLUICE_BUILD_EXAMPLES)
  list(APPEND SLUICE_DEBIAN_PACKAGES
    libuv1-dev          # examples: the curl loop inside libuv (examples/curl_libuv.c)
    libevent-dev        # examples: the curl loop inside libevent (examples/curl_libevent.c)
  )
endif()
if(NOT DEFINED SLUICE_BUILD_BENCH OR SLUICE_BUILD_BENCH)
  list(APPEND SLUICE_DEBIAN_PACKAGES
    nginx               # bench: nginx proxy_pass beside sluice-proxy (bench/proxy_bench.sh)
    wrk                 # bench: the load generator of bench/proxy_bench.sh
  )
endif()
# The fuzz preset builds libFuzzer targets: clang, and its fuzzer runtime,
# which Debian 12 ships only as a Recommends of clang.
if(SLUICE_BUILD_FUZZ)
  list(APPEND SLUICE_DEBIAN_PACKAGES clang libclang-rt-14-dev)
endif()

function(sluice_bootstrap_packages)
  set(missing "")
  foreach(pkg IN LISTS SLUICE_DEBIAN_PACKAGES)
    execute_process(COMMAND dpkg-query -W -f=\${Status} ${pkg}
      OUTPUT_VARIABLE status ERROR_QUIET RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT status MATCHES "install ok installed")
      list(APPEND missing ${pkg})
    endif()
  endforeach()
  if(NOT missing)
    return()
  endif()
  list(JOIN missing " " missing_str)

  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(prefix "")
  if(NOT uid STREQUAL "0")
    execute_process(COMMAND sudo -n true RESULT_VARIABLE sudo_rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT sudo_rc EQUAL 0)
      message(FATAL_ERROR "sluice: missing Debian packages: ${missing_str}\n"
        "Install them with:\n  sudo apt-get update && sudo apt-get install -y ${missing_str}")
    endif()
    set(prefix sudo -n)
  endif()

  message(STATUS "sluice: installing missing Debian packages: ${missing_str}")
  execute_process(COMMAND ${prefix} env DEBIAN_FRONTEND=noninteractive apt-get update -q
    RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    execute_process(COMMAND ${prefix} env DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q --no-install-recommends ${missing} RESULT_VARIABLE rc)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sluice: apt-get failed (exit ${rc}). Install by hand:\n"
      "  apt-get update && apt-get install -y ${missing_str}")
  endif()
endfunction()

# The official OpenAI Node SDK, for tests/e2e/proxy_openai_node.c: installed with npm into
# the build tree (BUILD/node/node_modules), never system-wide, and only when the presets
# bootstrap; without it that test is skipped. The major version is pinned so that a new
# SDK changes the test only when someone raises it here.
set(SLUICE_OPENAI_NODE_SDK "openai@7")
function(sluice_bootstrap_node_sdk)
  if(DEFINED SLUICE_BUILD_TESTS AND NOT SLUICE_BUILD_TESTS)
    return()
  endif()
  set(prefix ${CMAKE_BINARY_DIR}/node)
  if(EXISTS ${prefix}/node_modules/openai/package.json)
    return()
  endif()
  find_program(npm_exe npm)
  if(NOT npm_exe)
    message(WARNING "sluice: npm not found; the OpenAI Node SDK test will be skipped")
    return()
  endif()
  message(STATUS "sluice: installing ${SLUICE_OPENAI_NODE_SDK} into ${prefix} (npm)")
  execute_process(COMMAND ${npm_exe} install --prefix ${prefix} --no-audit --no-fund
                          --loglevel=error ${SLUICE_OPENAI_NODE_SDK}
                  RESULT_VARIABLE rc TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(WARNING "sluice: npm install ${SLUICE_OPENAI_NODE_SDK} failed (${rc}); the OpenAI "
                    "Node SDK test will be skipped")
  endif()
endfunction()
