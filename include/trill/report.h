/* `trill report`: a run folder's metrics as one self-contained HTML page (inline SVG charts, no
 * script, nothing fetched), several runs overlaid in each chart with a legend. */
#ifndef TRILL_REPORT_H
#define TRILL_REPORT_H

#include "trill/error.h"

/* The report of runs[0..n) (run folders: metrics.jsonl, and config.yaml and async_summary.json
 * when present) written to out (atomically). A line of metrics.jsonl that is not a JSON object
 * with an integer "step" is an error naming the file and the line; a last line without its
 * newline (a run still writing it) is left out, so a run in progress is reported up to its last
 * complete step. Where the steps go back (a resumed run appended to the file), a warning names
 * the line and the later lines' steps are drawn. A long run is drawn in at most 1000 ranges of
 * steps (the page says so), in memory bounded by the page. *steps (optional): the steps drawn
 * over all runs. */
trill_status trill_report_write(const char *const *runs, int n, const char *out, long *steps);

#endif
