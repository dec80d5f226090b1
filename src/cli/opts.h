/* A subcommand's options, declared once in a table: parsing (getopt_long underneath), the
 * `--help` text and so docs/cli.md's help blocks (tests/cli/cli_doc.sh) all come from it.
 *
 *   static const char *model;
 *   static long long k = 4;
 *   const cli_opt opts[] = {
 *       { "model", CLI_STR, "DIR", "the model folder", .str = &model, .required = true },
 *       { "k", CLI_INT, "K", "samples per prompt", .i = &k, .min = 1, .max = 1 << 16 },
 *   };
 *   const cli_spec spec = { "eval", NULL, "Samples K completions ...", opts, 2 };
 *   int first, rc = cli_parse(&spec, argc, argv, &first); (rc: 0 go on; CLI_HELP_SHOWN exit 0; else exit rc)
 *
 * A default is whatever the destination holds before parsing; the help shows it unless
 * `no_default` (shown as "(default: ...)"). */
#ifndef TRILL_CLI_OPTS_H
#define TRILL_CLI_OPTS_H

#include <stdbool.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_STR,     /* const char *: the argument */
    CLI_INT,     /* long long in [min, max] */
    CLI_DOUBLE,  /* double in [dmin, dmax] */
    CLI_FLAG,    /* bool: set when given (no argument) */
    CLI_CHOICE,  /* int: the index of the argument in `choices` (NULL-terminated) */
    CLI_LIST,    /* const char *list[max] and *count: every occurrence, in order */
} cli_kind;

typedef struct cli_opt {
    const char *name;            /* --name */
    cli_kind kind;
    const char *metavar;         /* the argument's name in the usage ("DIR"); CLI_CHOICE shows its choices */
    const char *help;            /* one line */
    const char **str;            /* CLI_STR; CLI_LIST: the array */
    long long *i;                /* CLI_INT */
    double *d;                   /* CLI_DOUBLE */
    bool *flag;                  /* CLI_FLAG */
    int *choice;                 /* CLI_CHOICE */
    int *count;                  /* CLI_LIST */
    long long min, max;          /* CLI_INT's range; CLI_LIST's capacity in max */
    double dmin, dmax;           /* CLI_DOUBLE's range */
    const char *const *choices;  /* CLI_CHOICE */
    bool required;
    bool no_default;             /* the help shows no default (a default that is not a value) */
} cli_opt;

typedef struct cli_spec {
    const char *cmd;             /* "eval" ("bench train": a subcommand's) */
    const char *args;            /* the positional part of the usage line ("RUN_DIR [RUN_DIR ...]"), NULL: none */
    const char *about;           /* what it does, lines after the usage line (each indented by two spaces) */
    const cli_opt *opts;
    int n_opts;
} cli_spec;

enum { CLI_HELP_SHOWN = -1 };

/* Parses argv[1, argc) by spec (--name VALUE, --name=VALUE, --help). Returns 0 with the positional
 * arguments at argv[*first, argc) (refused unless spec->args), CLI_HELP_SHOWN after printing the help
 * to stdout, or EXIT_USAGE after a message naming the option and what was expected. */
int cli_parse(const cli_spec *spec, int argc, char **argv, int *first);
/* The usage line ("trill eval --model DIR [--k K] ..."), wrapped, into out (size bytes). */
void cli_usage_line(const cli_spec *spec, char *out, size_t size);
/* The help: "usage: " and the usage line, the about text, then a line per option with its default. */
void cli_print_help(const cli_spec *spec, FILE *f);
/* A usage error: "trill CMD: message" and the usage line to stderr; returns EXIT_USAGE. */
int cli_spec_error(const cli_spec *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
