/* Shared pieces of the `trill` subcommands. Exit codes: 0 ok, 1 failure, 2 usage. */
#ifndef TRILL_CLI_H
#define TRILL_CLI_H

#include <getopt.h>
#include <stdio.h>

#include "trill/error.h"

enum { EXIT_USAGE = 2 };

int cmd_init(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* trill bench generate (cmd_bench_generate.c); argv[0] is "generate". */
int bench_generate(int argc, char **argv);

/* Prints "trill CMD: message" and the usage hint to stderr; returns EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prints "trill CMD: <the current trill error>" to stderr; returns 1. */
int cli_fail(const char *cmd);
/* The job's ranks (trill/dist.h): one process unless started by mpirun/srun. */
struct trill_comm *cli_world(void);

/* SIGINT and SIGTERM (unless ignored when trill started) ask the run in progress to stop after
 * its current step and checkpoint it (trill_rl_request_stop); a second one ends the process at
 * once. `cmd` names the command in the message printed on the first. */
void cli_catch_stop_signals(const char *cmd);
/* The exit status of a run that stopped on request: 128 + the signal, as a shell reports it. */
int cli_stopped_status(void);

/* The run configuration of `trill train` and `trill sft` from argv[first, argc): the defaults, an
 * optional CONFIG.yaml (a first argument without '='), then section.key=value overrides, each
 * through `set` (NULL: trill_run_config_set, a failure a usage error with its message). Returns 0
 * with *cfg to free, or the exit status with *cfg freed. */
struct trill_run_config;
struct cli_spec;
int cli_run_config(const struct cli_spec *spec, int argc, char **argv, int first,
                   int (*set)(const struct cli_spec *, struct trill_run_config *, const char *), struct trill_run_config *cfg);

#endif
