/* Transports: what carries an executor (exec/exec.h) for the scheduler (sched/sched.h), which sees
 * every executor through one interface, a port: work is issued to it, finished batches are
 * collected from it, new weights are published through it, and it is stopped. Ports chain: a port
 * with an upstream port takes its work from that port's finished batches (the reward executor's
 * from the generator's), so the scheduler collects from the last port of the chain only.
 *   inline  the work runs on the thread that collects it (the controller's, or the thread of the
 *           port downstream);
 *   thread  a thread of its own, with a bounded queue of finished batches and its own cores; the
 *           generator's takes new weights from a weight channel between engine steps;
 *   ranks   the generator replicas on ranks of their own (work issued by message, batches
 *           received from them, weights by broadcast) or the scorer's rank.
 * A placement is a choice of transport per executor (sched/placement.c). */
#ifndef TRILL_RL_TRANSPORT_H
#define TRILL_RL_TRANSPORT_H

#include <sched.h>

#include "rl/exec/exec.h"

typedef struct rl_port rl_port;

typedef struct rl_port_ops {
    const char *name;             /* the transport: "inline", "thread", "ranks" */
    /* Work for the executor (ro->index set; ro->redo: generate it again, ahead of the rest); takes ro.
     * (NULL on a port that takes its work from upstream.) */
    trill_status (*issue)(rl_port *p, rl_rollout *ro);
    /* The next finished batch, waiting for it: the regenerated one first, else the smallest index
     * (thread), or in the order issued. */
    trill_status (*collect)(rl_port *p, rl_rollout **out);
    /* New weights after an update (NULL: the executor takes none); *ms and *bytes describe it. */
    trill_status (*publish)(rl_port *p, double *ms, size_t *bytes);
    /* The executor's last weight load, into the step's metrics (NULL: nothing to add). */
    void (*figures)(rl_port *p, trill_rl_metrics *m);
    /* The executor's own failure, when it has failed on a thread of its own (NULL: never). */
    trill_status (*failure)(rl_port *p);
    /* Stops taking work and wakes whoever waits on the port (NULL: nothing to wake); before any stop. */
    void (*close)(rl_port *p);
    /* Ends the work in flight (joins a thread, drains the replicas) and frees the port; *busy_s: the
     * seconds the executor worked (its busy time in the async summary). Returns st or, when st is
     * TRILL_OK, the executor's own error. */
    trill_status (*stop)(rl_port *p, trill_status st, double *busy_s);
} rl_port_ops;

struct rl_port {
    const rl_port_ops *ops;
    rl_exec exec;
    rl_port *up;                  /* where the work comes from (NULL: issued to this port) */
};

/* An executor's cores: how many OpenMP threads, and the CPUs to pin to (n 0: not pinned). */
typedef struct rl_cores {
    int threads;
    int n;
    int cpu[CPU_SETSIZE];
} rl_cores;
/* The three sets of the thread placement (generator, trainer, reward), from resources.*: cores 0..
 * to the generator, then the trainer, then the reward executor; a refusal when pinning needs more
 * cores than the process may use. */
trill_status trill_rl_cores_plan(const trill_run_config *c, rl_cores out[3]);
/* The calling thread onto k's cores and thread count. */
void trill_rl_cores_enter(const rl_cores *k);

/* exec on the thread that collects (up: its work; NULL: what is issued). */
trill_status trill_rl_port_inline(rl_exec exec, rl_port *up, rl_port **out);
/* exec on a thread of its own, on cores k (copied), with room for `capacity` finished batches (a
 * regenerated one may take one more); the generator's takes weights from a channel that the port's
 * publish fills. The thread starts at once. */
trill_status trill_rl_port_thread(rl_exec exec, rl_port *up, const rl_cores *k, int capacity, rl_port **out);
/* The executor on ranks of its own (ranks.h): the generator replicas (ack: every update waits
 * until the replicas have applied it, as sync mode needs; else the replicas take it between decode
 * steps) or the scorer's rank (up: the batches to score). */
trill_status trill_rl_port_ranks(rl_exec exec, rl_port *up, bool ack, rl_port **out);

#endif
