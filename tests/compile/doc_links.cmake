# Every relative Markdown link in the project's documents points at a file
# or folder that exists, so a file that moves cannot leave a dead link in
# the README, tests/README.md, bench/RESULTS.md or docs/. And every Markdown
# file that the code names (a comment's "see bench/RESULTS.md", a test that
# reads README.md) is in the tree, so no comment leans on a document a
# reader of the repository does not have.
#   cmake -DROOT=<source dir> -P doc_links.cmake
# Links with a scheme (https:, mailto:) and in-page anchors are not checked;
# a link's own #anchor is dropped before the file is looked up.

# `text`: the file's contents, less the brackets and semicolons that would
# split a match list wrongly ("[" is "<", "]" is ">"); `dir`: its folder;
# `shown`: its path from the root.
macro(read_file_to_match file)
  file(READ ${file} text)
  string(REPLACE "[" "<" text "${text}")
  string(REPLACE "]" ">" text "${text}")
  string(REPLACE ";" "," text "${text}")
  get_filename_component(dir ${file} DIRECTORY)
  file(RELATIVE_PATH shown ${ROOT} ${file})
endmacro()

file(GLOB docs ${ROOT}/README.md ${ROOT}/tests/README.md ${ROOT}/bench/*.md ${ROOT}/docs/*.md)
set(dead "")
foreach(doc IN LISTS docs)
  read_file_to_match(${doc})
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

# The code: every path ending in .md, in comments and strings alike, found
# from the repository's root or from the naming file's folder (a leading
# "/", "./" or "../" is dropped: `__FILE__ "/../../README.md"`, `${ROOT}/README.md`).
set(sources "")
foreach(tree include shim tests bench examples cmake .ci)
  file(GLOB_RECURSE found LIST_DIRECTORIES false ${ROOT}/${tree}/*)
  list(APPEND sources ${found})
endforeach()
list(FILTER sources INCLUDE REGEX "(\\.(c|h|py|sh|cmake|in|cjs|html)|/CMakeLists\\.txt|/\\.ci/[^/.]+)$")
list(APPEND sources ${ROOT}/CMakeLists.txt ${ROOT}/CMakePresets.json)
set(named 0)
foreach(src IN LISTS sources)
  read_file_to_match(${src})
  string(REGEX MATCHALL "[A-Za-z0-9_./-]+\\.md[^A-Za-z0-9_]" paths "${text}")
  foreach(path IN LISTS paths)
    string(REGEX REPLACE ".$" "" path "${path}")
    if(path MATCHES "^//") # a URL's host and path
      continue()
    endif()
    string(REGEX REPLACE "^(/|\\./|\\.\\./)+" "" path "${path}")
    math(EXPR named "${named} + 1")
    if(NOT EXISTS ${ROOT}/${path} AND NOT EXISTS ${dir}/${path})
      string(APPEND dead "\n  ${shown}: ${path}")
    endif()
  endforeach()
endforeach()

if(dead)
  message(FATAL_ERROR "links to, or mentions of, files that do not exist:${dead}")
endif()
list(LENGTH docs n)
list(LENGTH sources m)
message(STATUS "${n} documents, every relative link resolves; "
               "${m} source files name ${named} .md paths, all in the tree")
