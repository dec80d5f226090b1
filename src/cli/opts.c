/* Subcommand options from their tables (opts.h). */
#include "opts.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { WRAP = 100, VAL_HELP = 999, VAL_FIRST = 1000 };

/* "a, b or c" of a NULL-terminated list, into out. */
static void list_words(const char *const *w, char *out, size_t size) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; w[i] && at < size; i++)
        at += (size_t)snprintf(out + at, size - at, "%s%s", i == 0 ? "" : w[i + 1] ? ", " : " or ", w[i]);
}

/* The option's argument as usage and help show it: its metavar, its choices "a|b", or "" (a flag). */
static void arg_text(const cli_opt *o, char *arg, size_t size) {
    arg[0] = '\0';
    if (o->kind == CLI_CHOICE) {
        size_t at = 0;
        for (int i = 0; o->choices[i] && at < size; i++) at += (size_t)snprintf(arg + at, size - at, "%s%s", i ? "|" : "", o->choices[i]);
    } else if (o->kind != CLI_FLAG) {
        snprintf(arg, size, "%s", o->metavar ? o->metavar : "VALUE");
    }
}

/* One option as the usage line shows it, e.g. "[--k K]". */
static void usage_item(const cli_opt *o, char *out, size_t size) {
    char arg[256];
    arg_text(o, arg, sizeof arg);
    snprintf(out, size, "%s--%s%s%s%s%s", o->required ? "" : "[", o->name, arg[0] ? " " : "", arg, o->required ? "" : "]",
             o->kind == CLI_LIST ? "..." : "");
}

void cli_usage_line(const cli_spec *spec, char *out, size_t size) {
    size_t at = (size_t)snprintf(out, size, "trill %s", spec->cmd), line = 0;
    const size_t indent = at + 1;
    for (int i = spec->args ? -1 : 0; i < spec->n_opts && at < size; i++) { /* the positional arguments first */
        char item[320];
        if (i < 0) snprintf(item, sizeof item, "%s", spec->args);
        else usage_item(&spec->opts[i], item, sizeof item);
        if (at - line + 1 + strlen(item) > WRAP) { /* a new line, indented under the first option */
            at += (size_t)snprintf(out + at, size - at, "\n%*s", (int)indent, "");
            line = at - indent;
            at += (size_t)snprintf(out + at, size - at, "%s", item);
        } else {
            at += (size_t)snprintf(out + at, size - at, " %s", item);
        }
    }
}

/* The option's default as the help shows it ("" when none). */
static void default_of(const cli_opt *o, char *out, size_t size) {
    out[0] = '\0';
    if (o->required || o->no_default) return;
    switch (o->kind) {
    case CLI_STR: if (*o->str) snprintf(out, size, "%s", *o->str); break;
    case CLI_INT: snprintf(out, size, "%lld", *o->i); break;
    case CLI_DOUBLE: snprintf(out, size, "%g", *o->d); break;
    case CLI_CHOICE: snprintf(out, size, "%s", o->choices[*o->choice]); break;
    case CLI_FLAG:
    case CLI_LIST: break;
    }
}

/* "  HEAD                     text", the text's words wrapped at WRAP columns under its first. */
static void print_wrapped(FILE *f, const char *head, const char *text) {
    enum { COL = 27 };
    int col = fprintf(f, "  %-24s ", head);
    for (const char *p = text; *p;) {
        const size_t n = strcspn(p, " ");
        if (col > COL && col + 1 + (int)n > WRAP) col = fprintf(f, "\n%*s", COL, "") - 1;
        else if (col > COL) col += fprintf(f, " ");
        col += fprintf(f, "%.*s", (int)n, p);
        p += n;
        p += strspn(p, " ");
    }
    fprintf(f, "\n");
}

void cli_print_help(const cli_spec *spec, FILE *f) {
    char usage[4096];
    cli_usage_line(spec, usage, sizeof usage);
    fprintf(f, "usage: %s\n", usage);
    for (const char *p = spec->about; p && *p;) { /* each line indented by two spaces */
        const char *nl = strchr(p, '\n');
        const int n = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(f, "  %.*s\n", n, p);
        p += n + (nl ? 1 : 0);
    }
    fprintf(f, "options:\n");
    for (int i = 0; i < spec->n_opts; i++) {
        const cli_opt *o = &spec->opts[i];
        char head[320], arg[256], def[256];
        arg_text(o, arg, sizeof arg);
        snprintf(head, sizeof head, "--%s%s%s", o->name, arg[0] ? " " : "", arg);
        default_of(o, def, sizeof def);
        char text[1024];
        snprintf(text, sizeof text, "%s%s%s%s%s", o->help, o->required ? " (required)" : "", def[0] ? " (default: " : "", def,
                 def[0] ? ")" : "");
        if (strlen(head) > 24) fprintf(f, "  %s\n", head); /* a long head on a line of its own */
        print_wrapped(f, strlen(head) > 24 ? "" : head, text);
    }
}

int cli_spec_error(const cli_spec *spec, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trill %s: ", spec->cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    char usage[4096];
    cli_usage_line(spec, usage, sizeof usage);
    fprintf(stderr, "\nusage: %s\n", usage);
    return EXIT_USAGE;
}

/* The option's argument into its destination. */
static int take(const cli_spec *spec, const cli_opt *o, const char *arg) {
    char *end;
    switch (o->kind) {
    case CLI_STR: *o->str = arg; return 0;
    case CLI_FLAG: *o->flag = true; return 0;
    case CLI_INT: {
        const long long v = strtoll(arg, &end, 10);
        if (*arg == '\0' || *end != '\0' || v < o->min || v > o->max)
            return cli_spec_error(spec, "--%s: expected an integer in [%lld, %lld], got \"%s\"", o->name, o->min, o->max, arg);
        *o->i = v;
        return 0;
    }
    case CLI_DOUBLE: {
        const double v = strtod(arg, &end);
        if (*arg == '\0' || *end != '\0' || !(v >= o->dmin && v <= o->dmax))
            return cli_spec_error(spec, "--%s: expected a number in [%g, %g], got \"%s\"", o->name, o->dmin, o->dmax, arg);
        *o->d = v;
        return 0;
    }
    case CLI_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (strcmp(o->choices[i], arg) == 0) {
                *o->choice = i;
                return 0;
            }
        char words[512];
        list_words(o->choices, words, sizeof words);
        return cli_spec_error(spec, "--%s: expected %s, got \"%s\"", o->name, words, arg);
    case CLI_LIST:
        if (*o->count >= o->max) return cli_spec_error(spec, "--%s: at most %lld of them", o->name, o->max);
        o->str[(*o->count)++] = arg;
        return 0;
    }
    return 0;
}

/* "--a, --b and --c are required" for the required options not given. */
static int missing(const cli_spec *spec, const bool *seen) {
    char list[1024] = "";
    size_t at = 0;
    int n = 0, total = 0;
    for (int i = 0; i < spec->n_opts; i++) total += spec->opts[i].required && !seen[i];
    for (int i = 0; i < spec->n_opts && at < sizeof list; i++) {
        if (!spec->opts[i].required || seen[i]) continue;
        n++;
        at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s", n == 1 ? "" : n == total ? " and " : ", ", spec->opts[i].name);
    }
    return total ? cli_spec_error(spec, "%s %s required", list, total == 1 ? "is" : "are") : 0;
}

int cli_parse(const cli_spec *spec, int argc, char **argv, int *first) {
    enum { MAX_OPTS = 64 };
    struct option lo[MAX_OPTS + 2];
    bool seen[MAX_OPTS] = { false };
    if (spec->n_opts > MAX_OPTS) return cli_spec_error(spec, "too many options in its table (%d)", spec->n_opts);
    for (int i = 0; i < spec->n_opts; i++)
        lo[i] = (struct option){ spec->opts[i].name, spec->opts[i].kind == CLI_FLAG ? no_argument : required_argument, NULL, VAL_FIRST + i };
    lo[spec->n_opts] = (struct option){ "help", no_argument, NULL, VAL_HELP };
    lo[spec->n_opts + 1] = (struct option){ 0, 0, 0, 0 };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
        if (c == VAL_HELP) {
            cli_print_help(spec, stdout);
            return CLI_HELP_SHOWN;
        }
        if (c == ':') return cli_spec_error(spec, "%s needs an argument", argv[optind - 1]);
        if (c < VAL_FIRST || c >= VAL_FIRST + spec->n_opts) return cli_spec_error(spec, "invalid option %s", argv[optind - 1]);
        const int i = c - VAL_FIRST, rc = take(spec, &spec->opts[i], optarg);
        if (rc) return rc;
        seen[i] = true;
    }
    if (optind < argc && !spec->args) return cli_spec_error(spec, "unexpected argument \"%s\"", argv[optind]);
    *first = optind;
    return missing(spec, seen);
}
