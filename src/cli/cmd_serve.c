/* trill serve: the post-training service (trill/service.h, docs/service.md), and its API keys. */
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/demo.h"
#include "trill/service.h"

static const char USAGE[] =
    "trill serve --models [NAME=]DIR|demo[,...] --state DIR [--listen HOST:PORT] [--max-body-mb N] [--max-trainers N]\n"
    "                   [--max-samplers N] [--max-queued N] [--max-adapter-mb N] [--max-connections N]\n"
    "                   [--max-client-connections N] [--request-timeout S] [--port-file FILE] [--max-seconds S]\n"
    "       trill serve keys add NAME --state DIR | keys list --state DIR | keys revoke NAME|ID --state DIR\n"
    "  Serves a Tinker-compatible post-training API over HTTP (docs/service.md): each base model loaded once, a\n"
    "  LoRA trainer per training client, every call answered with a future. --state holds the database (keys,\n"
    "  trainers, request log), saved states and the trainers' snapshots; after a restart every trainer is back at\n"
    "  its last committed optimizer step (every save is written whole, then committed with its request's result; one\n"
    "  server a state folder: STATE/.lock). A model is served under its folder's name, or NAME; `demo` is the embedded demo's\n"
    "  model (trill train's, prepared in the cache on first use). A first server makes the key \"default\" in\n"
    "  STATE/default.key. --listen defaults to 127.0.0.1:8100 (port 0: any free port, written to --port-file).\n"
    "  Limits: bodies 8 MB, 16 trainers and 64 samplers a key, 256 requests waiting, 4096 MB of adapters (a trainer's\n"
    "  counts its gradient and AdamW moments; samplers of one path share one copy), 1024 connections, 256 from one\n"
    "  address; a request's headers, then its body, must arrive within 30 s (--request-timeout). Stops on\n"
    "  SIGINT/SIGTERM, or after --max-seconds.\n"
    "  keys add prints the new key once (the database keeps its SHA-256 only). --print-routes prints the HTTP\n"
    "  routes (METHOD PATH, \"public\" after those that need no key) and exits.";

static volatile int g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static int keys(int argc, char **argv) {
    const char *state = NULL;
    const char *args[2] = { 0 };
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--state") == 0 && i + 1 < argc) state = argv[++i];
        else if (n < 2) args[n++] = argv[i];
        else return cli_usage_error("serve keys", USAGE, "unexpected argument \"%s\"", argv[i]);
    }
    if (!state) return cli_usage_error("serve keys", USAGE, "--state DIR is needed");
    if (n < 1) return cli_usage_error("serve keys", USAGE, "add, list or revoke?");
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
    return cli_usage_error("serve keys", USAGE, "expected keys add NAME, keys list or keys revoke NAME|ID");
}

/* "a,NAME=b,demo" into folders and names (the text is cut in place): NAME=DIR serves DIR as
 * NAME, a bare DIR under its folder's name, and `demo` the embedded demo's warm-started model
 * (prepared in the cache as trill train does, served as "demo"; a folder named demo is ./demo).
 * *demo_dir takes what the demo's entry points to (the caller frees it). Returns the count, or
 * minus the exit status after printing why. */
static int split_models(char *list, const char **dirs, const char **names, int max, char **demo_dir) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) return -cli_usage_error("serve", USAGE, "--models: at most %d models", max);
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

int cmd_serve(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "keys") == 0) return keys(argc - 1, argv + 1);
    trill_serve_config c = trill_serve_config_default();
    static struct option opts[] = {
        { "models", required_argument, 0, 'm' },   { "state", required_argument, 0, 's' },       { "listen", required_argument, 0, 'l' },
        { "max-body-mb", required_argument, 0, 'b' }, { "max-trainers", required_argument, 0, 't' }, { "max-queued", required_argument, 0, 'q' },
        { "port-file", required_argument, 0, 'p' }, { "max-seconds", required_argument, 0, 'x' },   { "help", no_argument, 0, 'h' },
        { "max-adapter-mb", required_argument, 0, 'a' }, { "max-samplers", required_argument, 0, 'S' },
        { "max-connections", required_argument, 0, 'c' }, { "max-client-connections", required_argument, 0, 'C' },
        { "request-timeout", required_argument, 0, 'T' }, { "print-routes", no_argument, 0, 'R' },
        { 0, 0, 0, 0 }
    };
    char *models = NULL, host[64] = "127.0.0.1", *demo_dir = NULL;
    const char *dirs[64], *names[64];
    long long v = 0;
    double max_seconds = 0;
    int opt, bad = 0;
    optind = 1;
    while (!bad && (opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': models = optarg; break;
        case 's': c.state_dir = optarg; break;
        case 'l': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || (size_t)(colon - optarg) >= sizeof host)
                return cli_usage_error("serve", USAGE, "--listen: expected HOST:PORT, e.g. 127.0.0.1:8100");
            memcpy(host, optarg, (size_t)(colon - optarg));
            host[colon - optarg] = '\0';
            bad = cli_parse_int("serve", USAGE, "--listen's port", colon + 1, 0, 65535, &v);
            c.port = (int)v;
            break;
        }
        case 'b': bad = cli_parse_int("serve", USAGE, "--max-body-mb", optarg, 1, 1024, &v); c.max_body_bytes = (size_t)v << 20; break;
        case 't': bad = cli_parse_int("serve", USAGE, "--max-trainers", optarg, 1, 100000, &v); c.max_trainers_per_key = (int)v; break;
        case 'q': bad = cli_parse_int("serve", USAGE, "--max-queued", optarg, 1, 1000000, &v); c.max_queued = (int)v; break;
        case 'p': c.port_file = optarg; break;
        case 'a': bad = cli_parse_int("serve", USAGE, "--max-adapter-mb", optarg, 1, 1 << 30, &v); c.max_adapter_bytes = (size_t)v << 20; break;
        case 'x': bad = cli_parse_double("serve", USAGE, "--max-seconds", optarg, 0, 1e9, &max_seconds); break;
        case 'S': bad = cli_parse_int("serve", USAGE, "--max-samplers", optarg, 1, 1000000, &v); c.max_samplers_per_key = (int)v; break;
        case 'c': bad = cli_parse_int("serve", USAGE, "--max-connections", optarg, 8, 1000000, &v); c.max_connections = (int)v; break;
        case 'C': bad = cli_parse_int("serve", USAGE, "--max-client-connections", optarg, 1, 1000000, &v); c.max_client_connections = (int)v; break;
        case 'T': bad = cli_parse_double("serve", USAGE, "--request-timeout", optarg, 0.1, 3600, &c.request_timeout); break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        case 'R': print_routes(); return 0;
        default: return cli_usage_error("serve", USAGE, "unknown option");
        }
    }
    if (bad) return bad;
    if (optind < argc) return cli_usage_error("serve", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!models || !c.state_dir) return cli_usage_error("serve", USAGE, "--models and --state are needed");
    c.host = host;
    c.model_dirs = dirs;
    c.model_names = names;
    if ((c.n_models = split_models(models, dirs, names, 64, &demo_dir)) < 1) {
        free(demo_dir);
        return c.n_models < 0 ? -c.n_models : cli_usage_error("serve", USAGE, "--models: 1 to 64 folders, comma-separated");
    }
    /* a connection is a file descriptor: as many as the hard limit allows (trill_serve serves fewer when that is short) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const int rc = trill_serve(&c, &g_stop, max_seconds) ? cli_fail("serve") : 0;
    free(demo_dir);
    return rc;
}
