# Writes the built-in library .mlir files into a C++ include: one
# {file name, text} entry per file, as raw string literals.
string(REPLACE "|" ";" IN "${IN}")
set(content "// Generated from dialect/library/*.mlir; do not edit.\n")
foreach(file IN LISTS IN)
  get_filename_component(name ${file} NAME)
  file(READ ${file} text)
  string(APPEND content "{\"${name}\", R\"spectra_library(${text})spectra_library\"},\n")
endforeach()
file(WRITE ${OUT} "${content}")
