/* A link's delay and reordering, in user space, for a kernel without netem.
 *
 *     link_delay QUEUE DELAY_MS JITTER_MS SEED
 *
 * Takes the packets that iptables' NFQUEUE target puts on queue QUEUE and lets
 * each through DELAY_MS +- JITTER_MS (uniform) after it arrived. Packets are let
 * through in the order their times come up, so a jitter wider than the gap
 * between two packets reorders them. SIGTERM or SIGINT, or the death of the
 * process that started it: everything still held or queued is let through at
 * once, then it exits. The emulated cluster
 * (emulated_cluster.py) starts one per delayed node, in the switch's namespace.
 */
#define _GNU_SOURCE /* ppoll */
#include <arpa/inet.h> /* before the kernel's headers, which defer to glibc's */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>

/* Packets held at once; beyond it the kernel lets them through undelayed
 * (NFQA_CFG_F_FAIL_OPEN) rather than drop them. */
#define MAX_HELD 65536
/* Messages read per pass, so that verdicts that are due are not held back. */
#define READS_PER_PASS 64
#define MAX_DELAY_MS 60000.0

struct held {
  int64_t due_ns;
  uint32_t id;
};

static struct held heap[MAX_HELD];  /* min-heap on due_ns */
static int held = 0;
static int64_t delay_ns, jitter_ns;
static uint64_t rng_state;
static volatile sig_atomic_t stopping = 0;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t next_random(void) {  /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void push(struct held h) {
  int i = held++;
  while (i > 0 && heap[(i - 1) / 2].due_ns > h.due_ns) {
    heap[i] = heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  heap[i] = h;
}

static struct held pop(void) {
  struct held top = heap[0], last = heap[--held];
  int i = 0;
  for (;;) {
    int child = 2 * i + 1;
    if (child >= held) break;
    if (child + 1 < held && heap[child + 1].due_ns < heap[child].due_ns) child++;
    if (heap[child].due_ns >= last.due_ns) break;
    heap[i] = heap[child];
    i = child;
  }
  if (held > 0) heap[i] = last;
  return top;
}

static int on_packet(struct nfq_q_handle* queue, struct nfgenmsg* msg, struct nfq_data* data, void* arg) {
  (void)msg;
  (void)arg;
  struct nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == NULL) return 0;
  uint32_t id = ntohl(header->packet_id);
  if (held == MAX_HELD) return nfq_set_verdict(queue, id, NF_ACCEPT, 0, NULL);
  /* uniform in [-jitter, +jitter], never before it arrived */
  int64_t offset = jitter_ns > 0 ? (int64_t)(next_random() % (uint64_t)(2 * jitter_ns + 1)) - jitter_ns : 0;
  int64_t wait = delay_ns + offset;
  push((struct held){now_ns() + (wait > 0 ? wait : 0), id});
  return 0;
}

static void on_signal(int sig) {
  (void)sig;
  stopping = 1;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s QUEUE DELAY_MS JITTER_MS SEED\n", argv[0]);
    return 2;
  }
  int queue_number = atoi(argv[1]);
  double delay_ms = atof(argv[2]), jitter_ms = atof(argv[3]);
  rng_state = strtoull(argv[4], NULL, 10);
  if (!(delay_ms >= 0 && delay_ms <= MAX_DELAY_MS && jitter_ms >= 0 && jitter_ms <= delay_ms)) {
    fprintf(stderr, "link_delay: need 0 <= jitter <= delay <= %.0f ms, got delay %s, jitter %s\n", MAX_DELAY_MS,
            argv[2], argv[3]);
    return 2;
  }
  delay_ns = (int64_t)(delay_ms * 1e6);
  jitter_ns = (int64_t)(jitter_ms * 1e6);
  prctl(PR_SET_PDEATHSIG, SIGTERM);  /* never outlives the harness that started it */
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, NULL);
  sigaction(SIGINT, &action, NULL);

  struct nfq_handle* handle = nfq_open();
  if (handle == NULL) {
    perror("link_delay: nfq_open");
    return 1;
  }
  struct nfq_q_handle* queue = nfq_create_queue(handle, queue_number, on_packet, NULL);
  if (queue == NULL) {
    fprintf(stderr, "link_delay: cannot bind queue %d (%s)\n", queue_number, strerror(errno));
    return 1;
  }
  uint32_t flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO;  /* whole GSO packets: far fewer to hold */
  if (nfq_set_mode(queue, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(queue, MAX_HELD) < 0 ||
      nfq_set_queue_flags(queue, flags, flags) < 0) {
    perror("link_delay: configuring the queue");
    return 1;
  }
  int fd = nfq_fd(handle);
  int one = 1, buffer = 16 << 20;
  /* A packet the kernel cannot hand over (socket buffer full) passes
   * undelayed (FAIL_OPEN): a big buffer keeps that rare. */
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) < 0 ||
      setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one) < 0) {
    perror("link_delay: socket options");
    return 1;
  }
  /* Signals arrive only inside ppoll: none is missed between the check and the wait. */
  sigset_t blocked, during_wait;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigprocmask(SIG_BLOCK, &blocked, &during_wait);
  printf("ready\n");
  fflush(stdout);

  static char packet[1 << 16];
  while (!stopping) {
    int64_t now = now_ns();
    while (held > 0 && heap[0].due_ns <= now) nfq_set_verdict(queue, pop().id, NF_ACCEPT, 0, NULL);
    struct timespec timeout = {1, 0};
    if (held > 0) {
      int64_t wait = heap[0].due_ns - now;
      if (wait < 1000000000) timeout = (struct timespec){0, (long)wait};
    }
    struct pollfd readable = {fd, POLLIN, 0};
    if (ppoll(&readable, 1, &timeout, &during_wait) > 0) {
      for (int i = 0; i < READS_PER_PASS; i++) {
        ssize_t n = recv(fd, packet, sizeof packet, MSG_DONTWAIT);
        if (n <= 0) break;
        nfq_handle_packet(handle, packet, (int)n);
      }
    }
  }
  /* What the kernel has queued to us but we have not read yet would be
   * dropped when the queue goes: read it all, then let everything through. */
  for (;;) {
    ssize_t n = recv(fd, packet, sizeof packet, MSG_DONTWAIT);
    if (n <= 0) break;
    nfq_handle_packet(handle, packet, (int)n);
  }
  while (held > 0) nfq_set_verdict(queue, pop().id, NF_ACCEPT, 0, NULL);
  nfq_destroy_queue(queue);
  nfq_close(handle);
  return 0;
}
