/* One rank of the harness's MPI peer: times MPI_Bcast, MPI_Reduce and
 * MPI_Allreduce of float32 buffers the way the torch systems are timed (a
 * barrier, the op, a barrier; the monotonic clock every process on the host
 * shares; CPU time of this process). Rank r holds r + 1 (broadcast: the root
 * holds ones); the first warm-up trial checks the result exactly.
 *
 *   mpi_peer OPS SIZES WARMUP TRIALS ARRIVAL SETTLE LEAD   (OPS, SIZES: comma lists; sizes in bytes)
 *
 * Rank r calls the op SETTLE + r * ARRIVAL seconds after the barrier
 * (ARRIVAL > 0: participants becoming ready one by one; SETTLE: every rank has
 * left the barrier before any starts); with LEAD > 0 instead at rank 0's
 * clock reading after the barrier + LEAD + r * ARRIVAL (a common start).
 *
 * Rank 0 prints one JSON object per (op, size):
 *   {"op": "...", "size": N, "runs": [[[t0, t1, cores] for each rank] for each trial]}
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_op(const char* op, float* buf, float* out, int count, int rank) {
  if (strcmp(op, "broadcast") == 0) return MPI_Bcast(buf, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (strcmp(op, "reduce") == 0) return MPI_Reduce(buf, out, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (strcmp(op, "allreduce") == 0) return MPI_Allreduce(buf, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) fprintf(stderr, "mpi_peer: unknown op %s\n", op);
  MPI_Abort(MPI_COMM_WORLD, 2);
  return 1;
}

static int check(const char* op, const float* buf, const float* out, int count, int rank, int world) {
  float want = strcmp(op, "broadcast") == 0 ? 1.0f : (float)world * (float)(world + 1) / 2.0f;
  const float* got = strcmp(op, "broadcast") == 0 ? buf : out;
  if (strcmp(op, "reduce") == 0 && rank != 0) return 1;
  for (int i = 0; i < count; ++i) {
    if (got[i] != want) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc != 8) {
    if (rank == 0) fprintf(stderr, "usage: mpi_peer OPS SIZES WARMUP TRIALS ARRIVAL SETTLE LEAD\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int warmup = atoi(argv[3]), trials = atoi(argv[4]);
  const double arrival = atof(argv[5]);
  const double settle = atof(argv[6]);
  const double lead = atof(argv[7]);
  char* ops = strdup(argv[1]);
  for (char* op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
    char* sizes = strdup(argv[2]);
    char* save = NULL;
    for (char* s = strtok_r(sizes, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
      const long bytes = atol(s);
      const int count = (int)(bytes / 4);
      float* buf = malloc((size_t)count * 4 + 4);
      float* out = malloc((size_t)count * 4 + 4);
      double* mine = malloc(sizeof(double) * 3 * (size_t)trials);
      double* all = malloc(sizeof(double) * 3 * (size_t)trials * (size_t)world);
      for (int t = 0; t < warmup + trials; ++t) {
        const float v = strcmp(op, "broadcast") == 0 ? (rank == 0 ? 1.0f : 0.0f) : (float)(rank + 1);
        for (int i = 0; i < count; ++i) buf[i] = v, out[i] = 0.0f;
        MPI_Barrier(MPI_COMM_WORLD);
        if (lead > 0) {
          double start = now(CLOCK_MONOTONIC) + lead;
          MPI_Bcast(&start, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
          const double wait = start + rank * arrival - now(CLOCK_MONOTONIC);
          if (wait > 0) {
            usleep((useconds_t)(wait * 1e6));
          } else {
            fprintf(stderr, "mpi_peer: rank %d started %s %.1f ms after the common start (raise --common-start)\n",
                    rank, op, -wait * 1e3);
          }
        } else if (settle > 0 || arrival > 0) {
          usleep((useconds_t)((settle + rank * arrival) * 1e6));
        }
        const double c0 = now(CLOCK_PROCESS_CPUTIME_ID), t0 = now(CLOCK_MONOTONIC);
        run_op(op, buf, out, count, rank);
        const double t1 = now(CLOCK_MONOTONIC);
        MPI_Barrier(MPI_COMM_WORLD);
        const double c1 = now(CLOCK_PROCESS_CPUTIME_ID), t2 = now(CLOCK_MONOTONIC);
        if (t == 0 && !check(op, buf, out, count, rank, world)) {
          fprintf(stderr, "mpi_peer: wrong %s result on rank %d\n", op, rank);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
        if (t >= warmup) {
          double* m = mine + 3 * (t - warmup);
          m[0] = t0, m[1] = t1, m[2] = (c1 - c0) / (t2 - t0);
        }
      }
      MPI_Gather(mine, 3 * trials, MPI_DOUBLE, all, 3 * trials, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        printf("{\"op\": \"%s\", \"size\": %ld, \"runs\": [", op, bytes);
        for (int t = 0; t < trials; ++t) {
          printf(t ? ", [" : "[");
          for (int r = 0; r < world; ++r) {
            const double* m = all + 3 * ((size_t)r * trials + t);
            printf("%s[%.9f, %.9f, %.6f]", r ? ", " : "", m[0], m[1], m[2]);
          }
          printf("]");
        }
        printf("]}\n");
        fflush(stdout);
      }
      free(buf), free(out), free(mine), free(all);
    }
    free(sizes);
  }
  free(ops);
  MPI_Finalize();
  return 0;
}
