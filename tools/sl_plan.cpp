// sl_plan.cpp — program sl_plan: which layout trains this model fastest on this cluster, and does it fit? The
// planner's command line (labs/09_planner/plan_cli.cpp) on lab 09's REFERENCE: the program every README and
// bench/plan_*.py use, whatever a learner has written in labs/09_planner. Lab 09's own program is the same
// command on the learner's planner. Lesson: labs/09_planner/README.md.
//
//   build/bin/sl_plan --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq-len 2048 --global-batch 64 --gpus 2
#include "planner.h"  // defines: lab09::plan_main (lab 09's reference: lab09_ref)

int main(int argc, char** argv) { return scalelab::lab09::plan_main(argc, argv); }
