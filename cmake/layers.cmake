# The layers of docs/architecture.md as the build sees them: a library sees the headers of its own
# folder, and of the libraries it links, and nothing else, so a header of a layer it may not use
# does not compile ("comm/process_group.h: No such file" in src/store/), instead of waiting for a
# review.
#
# All of src/ is one include root, so the paths a file includes ("common/error.h") cannot say
# what a library may see. Instead each library gets a folder of its own in the build tree,
# build/layers/TARGET/, holding links to its source folders and to the public headers it
# implements, and publishes that folder to what links it: linking a lower layer is what makes its
# headers visible, transitively. The programs, tests and Python modules on top see everything.
#
#   dtrain_layer(dtrain_store FOLDERS store HEADERS store.h)
#
# FOLDERS are under src/, HEADERS (files or folders) under include/dtrain/.
function(dtrain_layer target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "FOLDERS;HEADERS")
  set(root ${PROJECT_BINARY_DIR}/layers/${target})
  file(REMOVE_RECURSE ${root})  # a folder or header no longer listed stops being visible
  foreach(folder ${arg_FOLDERS})
    get_filename_component(parent ${root}/${folder} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${folder} ${root}/${folder} SYMBOLIC)
  endforeach()
  foreach(header ${arg_HEADERS})
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/include/dtrain/${header})
      message(FATAL_ERROR "dtrain_layer(${target}): include/dtrain/${header} does not exist")
    endif()
    get_filename_component(parent ${root}/dtrain/${header} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/dtrain/${header} ${root}/dtrain/${header} SYMBOLIC)
  endforeach()
  file(MAKE_DIRECTORY ${root})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
endfunction()
