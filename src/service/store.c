/* The service's SQLite state (store.h) and the API keys (trill/service.h). */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "service/store.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/service.h"

struct svc_store {
    sqlite3 *db;
    pthread_mutex_t mu;
};

static const char SCHEMA[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=FULL;"
    "CREATE TABLE IF NOT EXISTS keys(id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, hash TEXT NOT NULL UNIQUE,"
    "  created INTEGER NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS trainers(id TEXT PRIMARY KEY, key_id TEXT NOT NULL, base TEXT NOT NULL, rank INTEGER NOT NULL,"
    "  seed INTEGER NOT NULL, mlp INTEGER NOT NULL, attn INTEGER NOT NULL, unembed INTEGER NOT NULL,"
    "  from_state TEXT, from_optimizer INTEGER NOT NULL DEFAULT 0,"
    "  step INTEGER NOT NULL DEFAULT 0, snapshot TEXT, created INTEGER NOT NULL, prev_snapshot TEXT);"
    "CREATE TABLE IF NOT EXISTS states(uri TEXT PRIMARY KEY, key_id TEXT NOT NULL, trainer_id TEXT NOT NULL, kind TEXT NOT NULL,"
    "  dir TEXT NOT NULL, step INTEGER NOT NULL, created INTEGER NOT NULL, version INTEGER NOT NULL DEFAULT 1, base TEXT);"
    "CREATE TABLE IF NOT EXISTS samplers(id TEXT PRIMARY KEY, key_id TEXT NOT NULL, base TEXT NOT NULL, model_path TEXT,"
    "  dir TEXT, version INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS requests(id TEXT PRIMARY KEY, key_id TEXT NOT NULL, target TEXT NOT NULL, kind TEXT NOT NULL,"
    "  status TEXT NOT NULL, result TEXT, created INTEGER NOT NULL, finished INTEGER);"
    /* a call's answer by its client's X-Idempotency-Key: a retry gets it again (a day) */
    "CREATE TABLE IF NOT EXISTS idempotency(key_id TEXT NOT NULL, token TEXT NOT NULL, answer TEXT NOT NULL, created INTEGER NOT NULL,"
    "  PRIMARY KEY(key_id, token));"
    "DELETE FROM idempotency WHERE created < strftime('%s', 'now') - 86400;";

/* What a state folder of an earlier trill lacks (user_version below 3): a trainer's snapshot
 * before its last (the fallback of a damaged one), a saved state's base model (it outlives its
 * trainer), a saved state's expiry (seconds since the epoch; NULL: never). A column that is
 * there already is fine. */
static const char *const UPGRADE[] = {
    "ALTER TABLE trainers ADD COLUMN prev_snapshot TEXT",
    "ALTER TABLE states ADD COLUMN base TEXT",
    "UPDATE states SET base = (SELECT base FROM trainers WHERE trainers.id = states.trainer_id) WHERE base IS NULL",
    "ALTER TABLE states ADD COLUMN expires INTEGER",
    "PRAGMA user_version = 3",
};

static trill_status upgrade(sqlite3 *db, const char *path) {
    sqlite3_stmt *q = NULL;
    int version = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    for (size_t i = 0; version < 3 && i < sizeof UPGRADE / sizeof UPGRADE[0]; i++) {
        char *err = NULL;
        if (sqlite3_exec(db, UPGRADE[i], NULL, NULL, &err) != SQLITE_OK && !(err && strstr(err, "duplicate column"))) {
            trill_status st = trill_error(TRILL_ERR_IO, "%s: bringing the tables up to date (%s): %s", path, UPGRADE[i], err ? err : "?");
            sqlite3_free(err);
            return st;
        }
        sqlite3_free(err);
    }
    return TRILL_OK;
}

trill_status trill_svc_store_open(const char *state_dir, svc_store **out) {
    *out = NULL;
    trill_status st = trill_mkdir_p(state_dir);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/trill.db", state_dir);
    svc_store *s = trill_calloc(1, sizeof *s);
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    pthread_mutexattr_t attr; /* recursive: recovery reads a row and looks up another while it reads */
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&s->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    char *err = NULL;
    /* made readable by its owner only before SQLite opens it (its -wal and -shm files take its mode) */
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd), chmod(path, 0600);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        st = trill_error(TRILL_ERR_IO, "%s: %s", path, s->db ? sqlite3_errmsg(s->db) : "cannot open");
    } else {
        sqlite3_busy_timeout(s->db, 5000); /* `trill serve keys` may write while a server runs */
        if (sqlite3_exec(s->db, SCHEMA, NULL, NULL, &err) != SQLITE_OK)
            st = trill_error(TRILL_ERR_IO, "%s: setting up the tables: %s", path, err ? err : "?");
        else st = upgrade(s->db, path);
    }
    sqlite3_free(err);
    if (st) { trill_svc_store_close(s); return st; }
    *out = s;
    return TRILL_OK;
}

void trill_svc_store_close(svc_store *s) {
    if (!s) return;
    sqlite3_close(s->db);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* One statement's rows (or none) under the caller's lock; SQLITE_DONE when it ran whole. */
static int run_locked(svc_store *s, const char *sql, const svc_arg *args, int n_args, svc_row_fn row, void *ctx) {
    sqlite3_stmt *stmt = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &stmt, NULL);
    for (int i = 0; rc == SQLITE_OK && i < n_args; i++)
        rc = args[i].type == 's' ? sqlite3_bind_text(stmt, i + 1, args[i].s, -1, SQLITE_TRANSIENT) : sqlite3_bind_int64(stmt, i + 1, args[i].i);
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        rc = sqlite3_step(stmt);
        if (rc == SQLITE_ROW && row) row(ctx, stmt);
        if (rc == SQLITE_DONE) break;
    }
    sqlite3_finalize(stmt);
    return rc;
}

trill_status trill_svc_store_run(svc_store *s, const char *what, const char *sql, const svc_arg *args, int n_args, svc_row_fn row,
                           void *ctx, int *changes) {
    pthread_mutex_lock(&s->mu);
    const int rc = run_locked(s, sql, args, n_args, row, ctx);
    trill_status st = rc == SQLITE_DONE ? TRILL_OK : trill_error(TRILL_ERR_IO, "state database: %s: %s", what, sqlite3_errmsg(s->db));
    if (changes) *changes = sqlite3_changes(s->db);
    pthread_mutex_unlock(&s->mu);
    return st;
}

trill_status trill_svc_store_transaction(svc_store *s, const svc_stmt *stmts, int n) {
    pthread_mutex_lock(&s->mu);
    trill_status st = TRILL_OK;
    if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        st = trill_error(TRILL_ERR_IO, "state database: %s: cannot begin: %s", stmts[0].what, sqlite3_errmsg(s->db));
    for (int i = 0; !st && i < n; i++)
        if (run_locked(s, stmts[i].sql, stmts[i].args, stmts[i].n_args, NULL, NULL) != SQLITE_DONE)
            st = trill_error(TRILL_ERR_IO, "state database: %s: %s", stmts[i].what, sqlite3_errmsg(s->db));
    if (!st && sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        st = trill_error(TRILL_ERR_IO, "state database: %s: cannot commit: %s", stmts[0].what, sqlite3_errmsg(s->db));
    if (st) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL); /* nothing of it stays */
    pthread_mutex_unlock(&s->mu);
    return st;
}

uint64_t trill_svc_random_u64(void) {
    uint64_t r = 0;
    while (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {} /* interrupted by a signal: try again */
    return r;
}

void trill_svc_new_id(char *out, size_t cap, const char *prefix) { snprintf(out, cap, "%s%016llx", prefix, (unsigned long long)trill_svc_random_u64()); }

void trill_svc_sha256_hex(const char *text, char out[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(text, strlen(text), md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void copy_text0(void *ctx, sqlite3_stmt *row) {
    const unsigned char *t = sqlite3_column_text(row, 0);
    snprintf(ctx, 32, "%s", t ? (const char *)t : "");
}

bool trill_svc_store_authenticate(svc_store *s, const char *key, char key_id[32]) {
    char hash[65];
    trill_svc_sha256_hex(key, hash);
    key_id[0] = '\0';
    svc_arg a = SVC_S(hash);
    return !trill_svc_store_run(s, "authenticating", "SELECT id FROM keys WHERE hash = ?1 AND revoked = 0", &a, 1, copy_text0, key_id, NULL) &&
           key_id[0];
}

int trill_svc_store_fail_pending(svc_store *s) {
    int n = 0;
    svc_arg a = SVC_I(time(NULL));
    trill_svc_store_run(s, "failing the requests of the last run",
                  "UPDATE requests SET status = 'error', finished = ?1, result = '{\"code\": \"server_restarted\", \"message\": "
                  "\"the server stopped while this request was queued or running; it was not completed and nothing it would have "
                  "changed was kept (a completed optimizer step, load or save records its result with it): submit it again\"}' "
                  "WHERE status = 'pending'",
                  &a, 1, NULL, NULL, &n);
    return n;
}

/* ---- keys (trill serve keys) ---- */

static trill_status open_keys(const char *state_dir, svc_store **s) {
    trill_status st = trill_svc_store_open(state_dir, s);
    if (st) trill_error_context("trill serve keys");
    return st;
}

/* A new key named `name` into the database; its text (shown once) in text. */
static trill_status add_key(svc_store *s, const char *name, char text[48]) {
    if (!name || !*name || strlen(name) > 64) return trill_error(TRILL_ERR_INVALID, "the key's name must be 1 to 64 characters");
    char id[32], hash[65];
    unsigned char raw[16];
    while (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {}
    strcpy(text, "tml-"); /* the prefix the official Tinker SDK requires of a key (keys made as trill-... before still work) */
    for (int i = 0; i < 16; i++) snprintf(text + 4 + 2 * i, 3, "%02x", raw[i]);
    trill_svc_new_id(id, sizeof id, "k-");
    trill_svc_sha256_hex(text, hash);
    svc_arg a[] = { SVC_S(id), SVC_S(name), SVC_S(hash), SVC_I(time(NULL)) };
    trill_status st = trill_svc_store_run(s, "adding a key", "INSERT INTO keys(id, name, hash, created) VALUES(?1, ?2, ?3, ?4)", a, 4, NULL, NULL, NULL);
    if (st && strstr(trill_error_message(), "UNIQUE")) st = trill_error(TRILL_ERR_INVALID, "a key named \"%s\" exists", name);
    return st;
}

trill_status trill_serve_key_add(const char *state_dir, const char *name, char **key) {
    *key = NULL;
    svc_store *s = NULL;
    char text[48];
    trill_status st = open_keys(state_dir, &s);
    if (!st) st = add_key(s, name, text);
    if (st) trill_error_context("trill serve keys add");
    trill_svc_store_close(s);
    if (!st && !(*key = trill_strdup(text))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    return st;
}

static void count_rows(void *ctx, sqlite3_stmt *row) { *(int *)ctx = sqlite3_column_int(row, 0); }

trill_status trill_svc_store_default_key(svc_store *s, const char *state_dir) {
    int n = 0;
    trill_status st = trill_svc_store_run(s, "counting keys", "SELECT COUNT(*) FROM keys", NULL, 0, count_rows, &n, NULL);
    if (st || n > 0) return st;
    char text[48], path[4096];
    if ((st = add_key(s, "default", text))) return st;
    snprintf(path, sizeof path, "%s/default.key", state_dir);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600); /* never readable by others, not even for a moment */
    const size_t len = strlen(text);
    text[len] = '\n';
    const bool ok = fd >= 0 && write(fd, text, len + 1) == (ssize_t)(len + 1) && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok) return trill_error(TRILL_ERR_IO, "%s: cannot write the default key", path);
    trill_log(TRILL_LOG_INFO, "trill serve: no API key existed: made the key \"default\", in %s (trill serve keys manages them)", path);
    return TRILL_OK;
}

typedef struct { char *buf; size_t len, cap; bool nomem; } text_buf;

static void append_key(void *ctx, sqlite3_stmt *row) {
    text_buf *b = ctx;
    char line[256];
    time_t t = (time_t)sqlite3_column_int64(row, 2);
    struct tm tm;
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    int n = snprintf(line, sizeof line, "%s\t%s\t%s%s\n", sqlite3_column_text(row, 0), sqlite3_column_text(row, 1), when,
                     sqlite3_column_int(row, 3) ? "\trevoked" : "");
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = trill_realloc(b->buf, cap);
        if (!p) { b->nomem = true; return; }
        b->buf = p, b->cap = cap;
    }
    memcpy(b->buf + b->len, line, (size_t)n + 1);
    b->len += (size_t)n;
}

trill_status trill_serve_key_list(const char *state_dir, char **out) {
    *out = NULL;
    svc_store *s = NULL;
    trill_status st = open_keys(state_dir, &s);
    if (st) return st;
    text_buf b = { 0 };
    st = trill_svc_store_run(s, "listing keys", "SELECT id, name, created, revoked FROM keys ORDER BY created, name", NULL, 0, append_key, &b, NULL);
    trill_svc_store_close(s);
    if (!st && b.nomem) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && !b.buf && !(b.buf = trill_strdup(""))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) { free(b.buf); return st; }
    *out = b.buf;
    return TRILL_OK;
}

trill_status trill_serve_key_revoke(const char *state_dir, const char *name_or_id) {
    svc_store *s = NULL;
    trill_status st = open_keys(state_dir, &s);
    if (st) return st;
    int n = 0;
    svc_arg a = SVC_S(name_or_id);
    st = trill_svc_store_run(s, "revoking a key", "UPDATE keys SET revoked = 1 WHERE name = ?1 OR id = ?1", &a, 1, NULL, NULL, &n);
    trill_svc_store_close(s);
    if (!st && n == 0) st = trill_error(TRILL_ERR_INVALID, "trill serve keys revoke: no key is named or has the id \"%s\"", name_or_id);
    return st;
}
