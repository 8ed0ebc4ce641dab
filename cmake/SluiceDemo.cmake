# The demo: `cmake --workflow --preset demo` builds only what it needs and,
# as its last step, builds the custom target `demo`, which runs sluice-demo
# straight on the terminal (USES_TERMINAL: no output capture, so the program
# sees a TTY and redraws its status line in place).
if(NOT TARGET sluice-demo)
  return()
endif()

set(SLUICE_DEMO_SVG "${PROJECT_BINARY_DIR}/demo-timeline.svg" CACHE FILEPATH
  "Where the demo target writes its timeline plot")
set(SLUICE_DEMO_STATE "${PROJECT_BINARY_DIR}/demo-ceilings.json" CACHE FILEPATH
  "The demo target's state file (never the user's real one)")

# The demo finds its helpers next to itself; these paths are the fallback.
target_compile_definitions(sluice-demo PRIVATE
  SLUICE_DEMO_SIM_BUILT="$<TARGET_FILE:sluice-provider-sim>"
  SLUICE_DEMO_SLUICECTL_BUILT="$<TARGET_FILE:sluicectl>")
add_dependencies(sluice-demo sluice-provider-sim sluicectl)

# $SLUICE_DEMO_CAP reaches the program through the environment of the build.
add_custom_target(demo
  COMMAND sluice-demo --svg ${SLUICE_DEMO_SVG} --state ${SLUICE_DEMO_STATE}
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  USES_TERMINAL
  VERBATIM)
add_dependencies(demo sluice-demo)
