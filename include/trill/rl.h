/* RL post-training (`trill train`), every API of it: the configuration (trill/run_config.h), a step's
 * metrics (trill/rl_metrics.h), the run and its handle (trill/run.h) and held-out evaluation
 * (trill/eval.h). Include the one you use; this header includes them all. */
#ifndef TRILL_RL_H
#define TRILL_RL_H

#include "trill/eval.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"
#include "trill/run.h"

#endif
