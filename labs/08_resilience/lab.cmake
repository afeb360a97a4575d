# labs/08_resilience/lab.cmake — what lab 08 builds besides its manifest (labs/08_resilience/lab.json; included by
# sl_add_lab_from_manifest in cmake/scalelab.cmake). Lab 08 trains lab 07's REFERENCE 3D-parallel model; its given
# plumbing (shard files, the file log, the skip list, the provocations and the heartbeat) is one library both
# tracks link, lab08_given (the manifest's "deps" names it).
add_library(lab08_given STATIC ${CMAKE_CURRENT_LIST_DIR}/shard_state.cpp ${CMAKE_CURRENT_LIST_DIR}/reshard.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/faults.cpp)
target_include_directories(lab08_given PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(lab08_given PUBLIC scalelab_common lab07_ref lab02_ref)
sl_target_defaults(lab08_given)
