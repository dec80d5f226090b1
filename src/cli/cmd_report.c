/* trill report: the metrics of one or more run folders as one self-contained HTML page. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/fileio.h"
#include "trill/report.h"

int cmd_report(int argc, char **argv) {
    const char *out = NULL;
    const cli_opt opts[] = { { "out", CLI_STR, "FILE.html", "where the page is written (default: the first run's report.html)", .str = &out } };
    const cli_spec spec = { "report", "RUN_DIR [RUN_DIR ...]",
                            "Charts of each run's metrics.jsonl (several runs overlaid, up to 8) in one HTML file with inline SVG,\n"
                            "readable offline.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int optind_, rc = cli_parse(&spec, argc, argv, &optind_);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    const int n = argc - optind_;
    if (n < 1) return cli_spec_error(&spec, "a run folder is required");
    char *def = out ? NULL : trill_path_join(argv[optind_], "report.html");
    if (!out && !def) return cli_fail("report");
    long steps = 0;
    trill_status st = trill_report_write((const char *const *)argv + optind_, n, out ? out : def, &steps);
    if (!st) fprintf(stderr, "trill report: %d run%s, %ld steps -> %s\n", n, n == 1 ? "" : "s", steps, out ? out : def);
    free(def);
    return st ? cli_fail("report") : 0;
}
