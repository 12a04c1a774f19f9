/* The project's own STREAM-style triad (a[i] = b[i] + s * c[i], FP32), an independent peer for
 * `make bench-roofline`. Built at benchmark time with `cc -O2 -fopenmp`.
 *
 * Usage: stream_triad N_ELEMENTS THREADS REPEATS
 * Prints one line: "best_GBps median_GBps checksum", bytes counted STREAM's way (3 x 4 x N per
 * call: read b, read c, write a; write-allocate traffic not counted).
 *
 * Reference: McCalpin, STREAM (stream.c): parallel first touch, static schedule, best of repeats.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N_ELEMENTS THREADS REPEATS\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int threads = atoi(argv[2]), repeats = atoi(argv[3]);
    if (n < 1 || threads < 1 || repeats < 1) {
        fprintf(stderr, "N_ELEMENTS, THREADS and REPEATS must be >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        return 3;
    }
    const float s = 3.0f;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { /* first touch by the thread that will use the page */
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    double *t = malloc((repeats + 1) * sizeof(double));
    for (int r = 0; r <= repeats; r++) { /* r = 0 is the warm-up */
        double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        t[r] = omp_get_wtime() - t0;
    }
    qsort(t + 1, repeats, sizeof(double), cmp);
    double bytes = 3.0 * sizeof(float) * (double)n;
    double checksum = 0.0;
    for (long i = 0; i < n; i += 4096) checksum += a[i];
    printf("%.4f %.4f %.1f\n", bytes / t[1] / 1e9, bytes / t[1 + repeats / 2] / 1e9, checksum);
    free(a);
    free(b);
    free(c);
    free(t);
    return 0;
}
