/* trill serve: the post-training service (trill/service.h, docs/service.md), and its API keys. */
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/demo.h"
#include "trill/service.h"

static const char ABOUT[] =
    "Serves a Tinker-style post-training API over HTTP (docs/service.md): each base model loaded once, a\n"
    "LoRA trainer per training client, every call answered with a future. --state holds the database (keys,\n"
    "trainers, request log), saved states and the trainers' snapshots; after a restart every trainer is back at\n"
    "its last committed optimizer step (every save is written whole, then committed with its request's result; one\n"
    "server a state folder: STATE/.lock). A model is served under its folder's name, or NAME; `demo` is the embedded demo's\n"
    "model (trill train's, prepared in the cache on first use). A first server makes the key \"default\" in\n"
    "STATE/default.key. An adapter's bytes count its gradient and AdamW moments; samplers of one path share one copy.\n"
    "A request's headers, then its body, must arrive within --request-timeout. Stops on SIGINT/SIGTERM, or after\n"
    "--max-seconds. API keys: trill serve keys --help.";

static volatile int g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static int keys(int argc, char **argv) {
    const char *state = NULL;
    const cli_opt opts[] = { { "state", CLI_STR, "DIR", "the server's state folder", .str = &state, .required = true } };
    const cli_spec spec = { "serve keys", "add NAME | list | revoke NAME|ID",
                            "API keys: add prints a new key once (the database keeps its SHA-256 only), list prints id, name,\n"
                            "creation time and whether revoked; a revoked key is refused from its next request.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    const char *args[2] = { 0 };
    int n = 0;
    for (int i = first; i < argc; i++) {
        if (n == 2) return cli_spec_error(&spec, "unexpected argument \"%s\"", argv[i]);
        args[n++] = argv[i];
    }
    if (n < 1) return cli_spec_error(&spec, "add, list or revoke?");
    if (strcmp(args[0], "list") == 0 && n == 1) {
        char *text = NULL;
        if (trill_serve_key_list(state, &text)) return cli_fail("serve keys");
        fputs(text, stdout);
        free(text);
        return 0;
    }
    if (strcmp(args[0], "add") == 0 && n == 2) {
        char *key = NULL;
        if (trill_serve_key_add(state, args[1], &key)) return cli_fail("serve keys");
        printf("%s\n", key);
        free(key);
        return 0;
    }
    if (strcmp(args[0], "revoke") == 0 && n == 2) return trill_serve_key_revoke(state, args[1]) ? cli_fail("serve keys") : 0;
    return cli_spec_error(&spec, "expected keys add NAME, keys list or keys revoke NAME|ID");
}

/* "a,NAME=b,demo" into folders and names (the text is cut in place): NAME=DIR serves DIR as
 * NAME, a bare DIR under its folder's name, and `demo` the embedded demo's warm-started model
 * (prepared in the cache as trill train does, served as "demo"; a folder named demo is ./demo).
 * *demo_dir takes what the demo's entry points to (the caller frees it). Returns the count, or
 * minus the exit status after printing why. */
static int split_models(const cli_spec *spec, char *list, const char **dirs, const char **names, int max, char **demo_dir) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) return -cli_spec_error(spec, "--models: at most %d models", max);
        char *eq = strchr(tok, '=');
        names[n] = NULL, dirs[n] = tok;
        if (eq) *eq = '\0', names[n] = tok, dirs[n] = eq + 1;
        if (strcmp(dirs[n], "demo") == 0 && !*demo_dir) {
            char *cache = trill_demo_cache_dir();
            trill_demo_info info = { 0 };
            if (!cache || trill_demo_prepare(cache, NULL, &info)) {
                free(cache);
                return -cli_fail("serve");
            }
            free(cache);
            *demo_dir = info.model_dir;
            info.model_dir = NULL;
            trill_demo_info_free(&info);
            dirs[n] = *demo_dir;
            if (!names[n]) names[n] = "demo";
        }
        n++;
    }
    return n;
}

/* The route table, METHOD PATH [public] a line (the tests' auth matrix is made from it). */
static void print_routes(void) {
    const char *method, *path;
    bool authenticated;
    for (int i = 0; trill_serve_route(i, &method, &path, &authenticated); i++)
        printf("%s /api/v1%s%s\n", method, path, authenticated ? "" : " public");
}

/* Serves until SIGINT/SIGTERM or max_seconds; the exit status. */
static int run_server(const trill_serve_config *c, double max_seconds) {
    /* a connection is a file descriptor: as many as the hard limit allows (trill_serve serves fewer when that is short) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a write to a connection its client closed is an error on that connection, never the server's end */
    return trill_serve(c, &g_stop, max_seconds) ? cli_fail("serve") : 0;
}

/* "HOST:PORT" into host and *port: 0, or -1 when it is not that. */
static int split_listen(const char *listen, char *host, size_t size, int *port) {
    const char *colon = strrchr(listen, ':');
    char *end = NULL;
    const long p = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == listen || (size_t)(colon - listen) >= size || !end || *end || colon[1] == '\0' || p < 0 || p > 65535) return -1;
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    *port = (int)p;
    return 0;
}

/* The limits as the options read them (counts, MB), from and into the server's config. */
typedef struct serve_limits { long long body_mb, trainers, samplers, queued, adapter_mb, conns, client_conns; } serve_limits;

static serve_limits limits_of(const trill_serve_config *c) {
    return (serve_limits){ (long long)(c->max_body_bytes >> 20), c->max_trainers_per_key, c->max_samplers_per_key, c->max_queued,
                           (long long)(c->max_adapter_bytes >> 20), c->max_connections, c->max_client_connections };
}

static void set_limits(trill_serve_config *c, const serve_limits *l) {
    c->max_body_bytes = (size_t)l->body_mb << 20;
    c->max_trainers_per_key = (int)l->trainers;
    c->max_samplers_per_key = (int)l->samplers;
    c->max_queued = (int)l->queued;
    c->max_adapter_bytes = (size_t)l->adapter_mb << 20;
    c->max_connections = (int)l->conns;
    c->max_client_connections = (int)l->client_conns;
}

int cmd_serve(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "keys") == 0) return keys(argc - 1, argv + 1);
    trill_serve_config c = trill_serve_config_default();
    const char *models_arg = NULL, *listen = "127.0.0.1:8100";
    char host[64], *models = NULL, *demo_dir = NULL;
    const char *dirs[64], *names[64];
    serve_limits l = limits_of(&c);
    double max_seconds = 0;
    bool routes = false;
    const cli_opt opts[] = {
        { "models", CLI_STR, "[NAME=]DIR|demo[,...]", "the base models served, comma-separated (required)", .str = &models_arg },
        { "state", CLI_STR, "DIR", "the server's state folder (required)", .str = &c.state_dir },
        { "listen", CLI_STR, "HOST:PORT", "where it listens (port 0: any free port, written to --port-file)", .str = &listen },
        { "max-body-mb", CLI_INT, "N", "a request body's MB at most", .i = &l.body_mb, .min = 1, .max = 1024 },
        { "max-trainers", CLI_INT, "N", "trainers a key", .i = &l.trainers, .min = 1, .max = 100000 },
        { "max-samplers", CLI_INT, "N", "samplers a key", .i = &l.samplers, .min = 1, .max = 1000000 },
        { "max-queued", CLI_INT, "N", "requests waiting at most", .i = &l.queued, .min = 1, .max = 1000000 },
        { "max-adapter-mb", CLI_INT, "N", "MB of adapters held at most", .i = &l.adapter_mb, .min = 1, .max = 1 << 30 },
        { "max-connections", CLI_INT, "N", "open connections at most", .i = &l.conns, .min = 8, .max = 1000000 },
        { "max-client-connections", CLI_INT, "N", "connections from one address at most", .i = &l.client_conns, .min = 1, .max = 1000000 },
        { "request-timeout", CLI_DOUBLE, "S", "seconds for a request's headers, then its body", .d = &c.request_timeout, .dmin = 0.1,
          .dmax = 3600 },
        { "session-timeout", CLI_DOUBLE, "S", "seconds a Tinker SDK client's session lives after its last heartbeat (then the models and samplers made in it are deleted)", .d = &c.session_timeout,
          .dmin = 1, .dmax = 1e7 },
        { "port-file", CLI_STR, "FILE", "where the port listened on is written", .str = &c.port_file },
        { "max-seconds", CLI_DOUBLE, "S", "stop after S seconds (0: never)", .d = &max_seconds, .dmin = 0, .dmax = 1e9 },
        { "print-routes", CLI_FLAG, NULL, "print the HTTP routes (METHOD PATH, \"public\" after those that need no key) and exit",
          .flag = &routes },
    };
    const cli_spec spec = { "serve", NULL, ABOUT, opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc0 = cli_parse(&spec, argc, argv, &first);
    if (rc0) return rc0 == CLI_HELP_SHOWN ? 0 : rc0;
    if (routes) {
        print_routes();
        return 0;
    }
    if (!models_arg || !c.state_dir) return cli_spec_error(&spec, "--models and --state are needed");
    if (split_listen(listen, host, sizeof host, &c.port))
        return cli_spec_error(&spec, "--listen: expected HOST:PORT with a port in [0, 65535], e.g. 127.0.0.1:8100, got \"%s\"", listen);
    set_limits(&c, &l);
    if (!(models = strdup(models_arg))) return cli_fail("serve");
    c.host = host;
    c.model_dirs = dirs;
    c.model_names = names;
    if ((c.n_models = split_models(&spec, models, dirs, names, 64, &demo_dir)) < 1) {
        free(demo_dir);
        free(models);
        return c.n_models < 0 ? -c.n_models : cli_spec_error(&spec, "--models: 1 to 64 folders, comma-separated");
    }
    const int rc = run_server(&c, max_seconds);
    free(demo_dir);
    free(models);
    return rc;
}
