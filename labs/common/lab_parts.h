// lab_parts.h — what every lab program hands the driver (scalelab/driver/train_loop.h LabParts): lab 02's
// loader and lab 01's throughput and MFU, of the track this program is built on. Every program links the
// references (lab01_ref, lab02_ref); lab 01's own program its track's lab 01 and lab 02's its track's lab 02
// (sl_lab_driver* in labs/CMakeLists.txt), so a learner's program runs the learner's code end to end. The
// driver itself links no lab: these three functions are all it needs from them.
#pragma once

#include "scalelab/driver/train_loop.h"  // defines: driver::LabParts
#include "shard_loader.h"                // defines: lab02::open_shard_loader (SL_TRACK_LAB02's)
#include "train_step.h"                  // defines: lab01::tokens_per_second, mfu (SL_TRACK_LAB01's)

namespace scalelab {

inline driver::LabParts lab_parts() { return {&lab02::open_shard_loader, &lab01::tokens_per_second, &lab01::mfu}; }

}  // namespace scalelab
