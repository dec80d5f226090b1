/* The service's durable state: STATE/trill.db (SQLite, WAL, synchronous FULL) holds the API keys
 * (SHA-256 of the key, never the key), the trainers and where their latest snapshot lies, the
 * saved states and samplers, and the request log with every completed result. One connection,
 * used under the store's mutex from the HTTP threads and the workers. */
#ifndef TRILL_SERVICE_STORE_H
#define TRILL_SERVICE_STORE_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#include "trill/error.h"

typedef struct svc_store svc_store;

/* One bound value of a statement: text ('s') or integer ('i'). */
typedef struct svc_arg { char type; const char *s; int64_t i; } svc_arg;
#define SVC_S(x) ((svc_arg){ .type = 's', .s = (x) })
#define SVC_I(x) ((svc_arg){ .type = 'i', .i = (int64_t)(x) })

/* Opens (and makes, readable by its owner only) STATE/trill.db, bringing an older schema up to
 * date. */
trill_status trill_svc_store_open(const char *state_dir, svc_store **out);
void trill_svc_store_close(svc_store *s);

/* Runs one statement with its arguments, calling row(ctx, stmt) for each result row (row may be
 * NULL); *changes (optional) takes the rows changed. Messages name the statement's purpose. */
typedef void (*svc_row_fn)(void *ctx, sqlite3_stmt *row);
trill_status trill_svc_store_run(svc_store *s, const char *what, const char *sql, const svc_arg *args, int n_args, svc_row_fn row,
                           void *ctx, int *changes);

/* One statement of a transaction. */
typedef struct svc_stmt { const char *what, *sql; const svc_arg *args; int n_args; } svc_stmt;
/* Runs the statements in one transaction: all of them or none. */
trill_status trill_svc_store_transaction(svc_store *s, const svc_stmt *stmts, int n);

/* A fresh id: prefix and 16 hex digits of the kernel's randomness. */
void trill_svc_new_id(char *out, size_t cap, const char *prefix);
uint64_t trill_svc_random_u64(void);
/* SHA-256 of text as 64 hex digits. */
void trill_svc_sha256_hex(const char *text, char out[65]);

/* The key's id when `key` is a key that is not revoked, else false. */
bool trill_svc_store_authenticate(svc_store *s, const char *key, char key_id[32]);

/* No key yet: makes one named "default" and writes it to STATE/default.key (mode 0600). */
trill_status trill_svc_store_default_key(svc_store *s, const char *state_dir);

/* Every request left pending by a server that stopped is an error "server_restarted". Returns
 * how many. */
int trill_svc_store_fail_pending(svc_store *s);

#endif
