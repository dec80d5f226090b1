/* The dataset's template rendering, for the library and its tests. */
#ifndef TRILL_RL_DATASET_INTERNAL_H
#define TRILL_RL_DATASET_INTERNAL_H

#include <jansson.h>

#include "trill/dataset.h"

/* Renders one template against a JSON object; `what` names the source in errors. */
trill_status trill_render_template(const char *template_, const json_t *fields, const char *what, char **out);

#endif
