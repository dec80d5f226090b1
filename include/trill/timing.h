/* Wall-clock timing for progress lines and benchmarks. */
#ifndef TRILL_TIMING_H
#define TRILL_TIMING_H

/* Seconds on a monotonic clock (differences only). */
double trill_now(void);

/* Sorts t[n] in place and returns its median. */
double trill_median(double *t, int n);

#endif
