# labs/09_planner/lab.cmake — what lab 09 builds besides its manifest (labs/09_planner/lab.json; included by
# sl_add_lab_from_manifest in cmake/scalelab.cmake, after the lab's programs exist).
# bin/sl_plan: the reference's program under the name every README uses, a copy made after each link
# (not a third compile of main.cpp: CLI11's headers make that the slowest file of the lab).
add_custom_command(TARGET lab09_planner_ref POST_BUILD
                   COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:lab09_planner_ref> ${CMAKE_BINARY_DIR}/bin/sl_plan
                   COMMENT "bin/sl_plan = bin/reference/lab09_planner")
add_custom_target(sl_plan ALL DEPENDS lab09_planner_ref)
