/* The MPI peer of `loom bench comm` (bench/comm_vs_peers.sh): all_reduce, all_gather,
 * reduce_scatter and broadcast of f32 through the MPI library it is built against, timed
 * the way Loom times its own: a checked first call, warm-up calls (5; 20 up to 1 MiB), the
 * calls per rep calibrated to ~0.1 s but never fewer than MIN_ITERS, REPS timed reps each
 * averaged over the ranks, the median reported with the spread of the reps around it.
 * Sizes as nccl-tests count them: all_reduce and broadcast the buffer, all_gather the
 * gathered output, reduce_scatter the input; busbw = algbw x 2(n-1)/n, (n-1)/n, (n-1)/n, 1.
 *
 *   mpirun -np N mpi_coll [--dirty-inputs] LABEL REPS MIN_ITERS SIZE [SIZE ...]
 *
 * OPS in the environment (a comma-separated list of the names below) runs only those ops.
 *
 * Prints '#' lines, then per op and size:
 *   LABEL NP OP BYTES TIME_US ALGBW_GBPS BUSBW_GBPS ITERS SPREAD_PCT ok|WRONG
 * where SPREAD_PCT = (slowest rep - fastest rep) / median x 100. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, OPS };
static const char *const kNames[OPS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

static int g_rank, g_size;
static float *g_send, *g_recv;

/* 1 when OPS is unset or names `name` as one of its comma-separated entries. */
static int wanted(const char *name) {
  const char *ops = getenv("OPS");
  if (ops == NULL || *ops == '\0') return 1;
  const size_t len = strlen(name);
  for (const char *p = ops;; ++p) {
    if (strncmp(p, name, len) == 0 && (p[len] == ',' || p[len] == '\0')) return 1;
    p = strchr(p, ',');
    if (p == NULL) return 0;
  }
}

static double bus_factor(int op) {
  if (op == ALL_REDUCE) return 2.0 * (g_size - 1) / g_size;
  if (op == BROADCAST) return 1.0;
  return (double)(g_size - 1) / g_size;
}

/* Elements each rank sends (all_gather) or receives (reduce_scatter), or the whole buffer. */
static size_t per_rank_count(int op, size_t bytes) {
  size_t n = bytes / sizeof(float);
  if (op == ALL_GATHER || op == REDUCE_SCATTER) n /= (size_t)g_size;
  return n < 1 ? 1 : n;
}

/* --dirty-inputs: before each call, write one byte of every 64-byte line of this rank's
 * input with its own value (as `loom bench comm --dirty-inputs`), so the call starts, as in
 * training, from an input just written by this rank's core. */
static int g_dirty;

static void write_inputs(int op, size_t n) {
  if (op == BROADCAST && g_rank != 0) return;
  volatile char *in = (volatile char *)g_send;
  const size_t bytes = (op == REDUCE_SCATTER ? n * (size_t)g_size : n) * sizeof(float);
  for (size_t i = 0; i < bytes; i += 64) in[i] = in[i];
}

static void run_once(int op, size_t n) {
  if (g_dirty) write_inputs(op, n);
  switch (op) {
    case ALL_REDUCE: MPI_Allreduce(g_send, g_recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case ALL_GATHER: MPI_Allgather(g_send, (int)n, MPI_FLOAT, g_recv, (int)n, MPI_FLOAT, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER: MPI_Reduce_scatter_block(g_send, g_recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    default: MPI_Bcast(g_rank == 0 ? g_send : g_recv, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
  }
}

/* One call with rank r contributing r + 1 everywhere; 1 when this rank's result is right. */
static int check(int op, size_t n) {
  const size_t total = op == ALL_GATHER || op == REDUCE_SCATTER ? n * (size_t)g_size : n;
  for (size_t i = 0; i < total; ++i) g_send[i] = (float)(g_rank + 1);
  memset(g_recv, 0, total * sizeof(float));
  run_once(op, n);
  const float sum = (float)g_size * (float)(g_size + 1) / 2;
  for (size_t i = 0; i < (op == ALL_GATHER ? total : n); ++i) {
    float want = op == ALL_GATHER ? (float)(i / n + 1) : op == BROADCAST ? 1.0f : sum;
    float got = op == BROADCAST && g_rank == 0 ? g_send[i] : g_recv[i];
    if (got != want) return 0;
  }
  return 1;
}

static double max_over_ranks(double x) {
  double m;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc > 1 && strcmp(argv[1], "--dirty-inputs") == 0) {
    g_dirty = 1;
    ++argv;
    --argc;
  }
  if (argc < 5) {
    if (g_rank == 0) fprintf(stderr, "usage: mpi_coll [--dirty-inputs] LABEL REPS MIN_ITERS SIZE [SIZE ...]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *label = argv[1];
  const int reps = atoi(argv[2]), min_iters = atoi(argv[3]);
  if (reps < 1 || reps > 64 || min_iters < 1) {
    if (g_rank == 0) fprintf(stderr, "mpi_coll: REPS must be 1-64 and MIN_ITERS at least 1\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t max_bytes = 0;
  for (int i = 4; i < argc; ++i) {
    size_t s = strtoull(argv[i], NULL, 10);
    if (s > max_bytes) max_bytes = s;
  }
  max_bytes += (size_t)g_size * sizeof(float); /* room for the per-rank rounding up to one element */
  g_send = malloc(max_bytes);
  g_recv = malloc(max_bytes);
  if (g_send == NULL || g_recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  if (g_rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(version, &len);
    char *nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    printf("# %s | np=%d | %s\n", label, g_size, version);
    printf("# label np op bytes time_us algbw_GBps busbw_GBps iters spread_pct check\n");
  }
  for (int op = 0; op < OPS; ++op) {
    if (!wanted(kNames[op])) continue;
    for (int a = 4; a < argc; ++a) {
      const size_t n = per_rank_count(op, strtoull(argv[a], NULL, 10));
      const size_t bytes = (op == ALL_GATHER || op == REDUCE_SCATTER ? n * (size_t)g_size : n) * sizeof(float);
      int ok = check(op, n), all_ok;
      MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      const int warm = bytes <= (1u << 20) ? 20 : 5;
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      for (int i = 0; i < warm; ++i) run_once(op, n);
      const double per_call = max_over_ranks((MPI_Wtime() - start) / warm);
      int iters = (int)(0.1 / (per_call > 1e-9 ? per_call : 1e-9));
      if (iters > 2000) iters = 2000;
      if (iters < min_iters) iters = min_iters;
      double times[64];
      for (int r = 0; r < reps; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
        for (int i = 0; i < iters; ++i) run_once(op, n);
        double mine = (MPI_Wtime() - start) / iters, sum;
        MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        times[r] = sum / g_size;
      }
      qsort(times, (size_t)reps, sizeof(double), by_value);
      const double t = times[reps / 2], algbw = (double)bytes / t / 1e9;
      if (g_rank == 0) {
        printf("%s %d %s %zu %.2f %.3f %.3f %d %.1f %s\n", label, g_size, kNames[op], bytes, t * 1e6, algbw,
               algbw * bus_factor(op), iters, 100.0 * (times[reps - 1] - times[0]) / t, all_ok ? "ok" : "WRONG");
        fflush(stdout);
      }
    }
  }
  free(g_send);
  free(g_recv);
  MPI_Finalize();
  return 0;
}
