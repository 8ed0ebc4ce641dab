# Every relative Markdown link in the project's documents points at a file
# or folder that exists, so a file that moves cannot leave a dead link in
# the README, tests/README.md, bench/RESULTS.md or docs/.
#   cmake -DROOT=<source dir> -P doc_links.cmake
# Links with a scheme (https:, mailto:) and in-page anchors are not checked;
# a link's own #anchor is dropped before the file is looked up.
file(GLOB docs ${ROOT}/README.md ${ROOT}/tests/README.md ${ROOT}/bench/*.md ${ROOT}/docs/*.md)
set(dead "")
foreach(doc IN LISTS docs)
  file(READ ${doc} text)
  # Brackets and semicolons would split the match list wrongly: take them out first.
  string(REPLACE "[" "<" text "${text}")
  string(REPLACE "]" ">" text "${text}")
  string(REPLACE ";" "," text "${text}")
  get_filename_component(dir ${doc} DIRECTORY)
  file(RELATIVE_PATH shown ${ROOT} ${doc})
  string(REGEX MATCHALL ">\\([^)# \t\n]+" links "${text}")
  foreach(link IN LISTS links)
    string(SUBSTRING "${link}" 2 -1 target)
    if(target MATCHES "^[a-z]+:")
      continue()
    endif()
    if(NOT EXISTS ${dir}/${target})
      string(APPEND dead "\n  ${shown}: (${target})")
    endif()
  endforeach()
endforeach()
if(dead)
  message(FATAL_ERROR "links to files that do not exist:${dead}")
endif()
list(LENGTH docs n)
message(STATUS "${n} documents, every relative link resolves")
