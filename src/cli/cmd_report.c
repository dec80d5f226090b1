/* trill report: the metrics of one or more run folders as one self-contained HTML page. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/fileio.h"
#include "trill/report.h"

static const char USAGE[] =
    "trill report RUN_DIR [RUN_DIR ...] [--out FILE.html]\n"
    "  Charts of each run's metrics.jsonl (several runs overlaid, up to 8) in one HTML file with inline SVG,\n"
    "  readable offline; --out defaults to the first run's report.html.";

int cmd_report(int argc, char **argv) {
    static const struct option opts[] = { { "out", required_argument, NULL, 'o' }, { "help", no_argument, NULL, 'h' }, { 0 } };
    const char *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'h') { puts(USAGE); return 0; }
        else return cli_usage_error("report", USAGE, "unknown option");
    }
    const int n = argc - optind;
    if (n < 1) return cli_usage_error("report", USAGE, "a run folder is required");
    char *def = out ? NULL : trill_path_join(argv[optind], "report.html");
    if (!out && !def) return cli_fail("report");
    long steps = 0;
    trill_status st = trill_report_write((const char *const *)argv + optind, n, out ? out : def, &steps);
    if (!st) fprintf(stderr, "trill report: %d run%s, %ld steps -> %s\n", n, n == 1 ? "" : "s", steps, out ? out : def);
    free(def);
    return st ? cli_fail("report") : 0;
}
