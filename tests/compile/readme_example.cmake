# Extract one of README.md's compiled examples into a C file, so that the
# examples cannot rot: the ```c block right after the INDEX-th line
#   <!-- example: compiled in CI -->
# (blank lines between them are allowed; INDEX counts from 1, default 1).
# Each block is a whole program. A #line directive makes compiler messages
# point at README.md's own lines.
#   cmake -DREADME=<README.md> -DOUT=<file.c> [-DINDEX=<n>] -P readme_example.cmake
# The text is handled as one string, never as a CMake list: C is full of the
# ';' and '[' that list splitting would mangle.
set(marker "<!-- example: compiled in CI -->")
set(lost "README lost its compiled example")
if(NOT EXISTS "${README}")
  message(FATAL_ERROR "${lost}: ${README} does not exist")
endif()
file(READ "${README}" text)
set(text "\n${text}") # the marker may be the first line; counts below allow for this one

# Lines in `s` before its end: the line number of what follows it, minus one.
function(count_lines s out)
  string(REGEX REPLACE "[^\n]" "" newlines "${s}")
  string(LENGTH "${newlines}" n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()

if(NOT DEFINED INDEX)
  set(INDEX 1)
endif()
if(INDEX GREATER 1)
  set(lost "README lost its compiled example ${INDEX}")
endif()
string(LENGTH "\n${marker}\n" marker_len)
set(after 0)
foreach(i RANGE 1 ${INDEX})
  string(SUBSTRING "${text}" ${after} -1 tail)
  string(FIND "${tail}" "\n${marker}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${lost}: no line '${marker}' number ${INDEX} in ${README} "
      "(put it on its own line right before the ```c block that CI must compile)")
  endif()
  # Step past the marker but keep its newline: the next marker may follow at once.
  math(EXPR after "${after} + ${at} + ${marker_len} - 1")
endforeach()
math(EXPR after "${after} + 1")
string(SUBSTRING "${text}" 0 ${after} before)
count_lines("${before}" marker_line)
math(EXPR marker_line "${marker_line} - 1") # the newline added above
string(SUBSTRING "${text}" ${after} -1 rest)

if(NOT rest MATCHES "^([ \t]*\n)*```c[ \t]*\n")
  message(FATAL_ERROR "${lost}: the line after ${README}:${marker_line} ('${marker}'), "
    "blank lines aside, is not a ```c fence")
endif()
string(LENGTH "${CMAKE_MATCH_0}" fence_len)
count_lines("${CMAKE_MATCH_0}" fence_lines)
math(EXPR first_line "${marker_line} + ${fence_lines} + 1")
string(SUBSTRING "${rest}" ${fence_len} -1 rest)
string(FIND "${rest}" "\n```" close)
if(NOT rest MATCHES "^```" AND close EQUAL -1)
  message(FATAL_ERROR "${lost}: the ```c block at ${README}:${first_line} is never closed")
endif()
if(rest MATCHES "^```")
  set(code "")
else()
  math(EXPR close "${close} + 1")
  string(SUBSTRING "${rest}" 0 ${close} code)
endif()
if(NOT code MATCHES "[^ \t\n]")
  message(FATAL_ERROR "${lost}: the ```c block at ${README}:${first_line} is empty")
endif()
file(WRITE "${OUT}.tmp" "#line ${first_line} \"${README}\"\n${code}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
