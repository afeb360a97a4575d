// main.cpp — lab 09: the planner's command line. Which layout for this model on this cluster: every tp x pp x dp
// split with its micro-batches, ZeRO stage, sequence parallelism and recompute, its memory per device and
// predicted step time; what does not fit counted with its reason; the rest ranked by predicted tokens/s. The
// program is shared by both tracks: the command line (options, the table, --json) is given, in
// labs/09_planner/plan_cli.cpp, and calls the functions of planner.h: your labs/09_planner/planner.cpp
// (bin/learner/lab09_planner) or the reference solutions/09_planner/planner.cpp (bin/reference/lab09_planner;
// bin/sl_plan is the same command on the reference, tools/sl_plan.cpp). Lesson: labs/09_planner/README.md.
//
//   build/bin/learner/lab09_planner --model d12 --gpus 8 --gpu h100 --seq-len 1024 --global-batch 64
//   build/bin/learner/lab09_planner --help      (the lesson's questions: labs/09_planner/README.md#the-faq-answered)
#include "planner.h"  // defines: lab09::plan_main (the command line; YOUR plan, step_time, device_memory, ...)

int main(int argc, char** argv) { return scalelab::lab09::plan_main(argc, argv); }
