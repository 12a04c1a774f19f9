/* McCalpin's four STREAM kernels (FP64), an independent peer for `make bench-roofline`:
 *   Copy  c = a         (2 x 8 x N bytes per call)
 *   Scale b = s * c     (2 x 8 x N)
 *   Add   c = a + b     (3 x 8 x N)
 *   Triad a = b + s * c (3 x 8 x N)
 * Bytes counted STREAM's way: each array read or written once per call; write-allocate traffic not
 * counted. Copy writes with non-temporal (streaming) stores where the compiler offers AVX-512 or AVX
 * intrinsics, as tuned STREAM builds do: the stores skip the cache, so no write-allocate read.
 * Built at benchmark time with `cc -O3 -march=native -fopenmp`.
 *
 * Usage: stream_triad N_ELEMENTS THREADS REPEATS
 * Prints one line per kernel, "name best_GBps median_GBps", then "copy_stores nontemporal|plain"
 * and "checksum X".
 *
 * Reference: McCalpin, STREAM (stream.c): parallel first touch, static schedule, best of repeats
 * after a warm-up, arrays several times the last-level cache.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static const char *copy_stores(void) {
#if defined(__AVX512F__) || defined(__AVX__)
    return "nontemporal";
#else
    return "plain";
#endif
}

/* c = a with streaming stores; n is a multiple of 8 and the arrays are 64-byte aligned. */
static void copy(double *restrict c, const double *restrict a, long n) {
#if defined(__AVX512F__)
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += 8) _mm512_stream_pd(c + i, _mm512_load_pd(a + i));
    _mm_sfence();
#elif defined(__AVX__)
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += 4) _mm256_stream_pd(c + i, _mm256_load_pd(a + i));
    _mm_sfence();
#else
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) c[i] = a[i];
#endif
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N_ELEMENTS THREADS REPEATS\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]) / 8 * 8;
    int threads = atoi(argv[2]), repeats = atoi(argv[3]);
    if (n < 8 || threads < 1 || repeats < 1) {
        fprintf(stderr, "N_ELEMENTS must be >= 8, THREADS and REPEATS >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    size_t bytes = (size_t)n * sizeof(double);
    double *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *c = aligned_alloc(64, bytes);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        return 3;
    }
    const double s = 3.0;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { /* first touch by the thread that will use the page */
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.0;
    }
    const char *names[4] = {"copy", "scale", "add", "triad"};
    const double moved[4] = {2.0 * bytes, 2.0 * bytes, 3.0 * bytes, 3.0 * bytes};
    double *t = malloc(4 * (repeats + 1) * sizeof(double));
    for (int r = 0; r <= repeats; r++) { /* r = 0 is the warm-up; the kernels take turns, as in stream.c */
        double t0 = omp_get_wtime();
        copy(c, a, n);
        t[0 * (repeats + 1) + r] = omp_get_wtime() - t0;
        t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) b[i] = s * c[i];
        t[1 * (repeats + 1) + r] = omp_get_wtime() - t0;
        t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i] + b[i];
        t[2 * (repeats + 1) + r] = omp_get_wtime() - t0;
        t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        t[3 * (repeats + 1) + r] = omp_get_wtime() - t0;
    }
    for (int k = 0; k < 4; k++) {
        double *tk = t + k * (repeats + 1) + 1;
        qsort(tk, repeats, sizeof(double), cmp);
        printf("%s %.4f %.4f\n", names[k], moved[k] / tk[0] / 1e9, moved[k] / tk[repeats / 2] / 1e9);
    }
    double checksum = 0.0;
    for (long i = 0; i < n; i += 4096) checksum += a[i] + b[i] + c[i];
    printf("copy_stores %s\nchecksum %.1f\n", copy_stores(), checksum);
    free(a);
    free(b);
    free(c);
    free(t);
    return 0;
}
