/* shm_link.c — shared-memory rings between two node processes of one host.
 *
 * One segment holds two rings, one per direction.  Each ring is a byte stream with
 * a producer counter and a consumer counter on their own cache lines; the producer
 * publishes bytes with a release store of its counter, the consumer frees space
 * with a release store of its own.  The stream carries the same framed messages as
 * a TCP socket, so the transport above treats both alike.
 *
 * A side with nothing to do sleeps on its doorbell, a futex word in the segment.
 * It declares itself sleepy first (an atomic increment, visible at once) and goes
 * on yielding for a while; only then does it read the bell, look at the rings once
 * more and wait while the bell keeps its value.  The other side, after moving a
 * counter, rings the bell (bumps it and wakes) when it sees a sleepy peer, with a
 * plain load: no fence on the busy path.  A counter store that this load raced
 * with reached the sleeper's second look long before (the yielding lies between),
 * and every sleep is bounded besides (the caller's slice), so no wake-up is lost
 * for longer than that.  A side that declares itself eager in its doorbell gets a
 * fence from its peer between the counter store and that load (Dekker's handshake
 * with the sleeper's increment), so that it may sleep with no while at all; a node
 * on a host with more processes than cores declares it as well, so that no wake-up
 * there rests on the while. */
#include "shm_link.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../error.h"
#include "../transport.h"

#define RING_BYTES (4u << 20)

struct ruccl_shm_ring {
  _Alignas(64) atomic_uint_fast64_t head; /* bytes ever written */
  _Alignas(64) atomic_uint_fast64_t tail; /* bytes ever read */
  _Alignas(64) unsigned char data[RING_BYTES];
};

typedef struct {
  _Alignas(64) atomic_uint bell;     /* bumped when the other side moved a counter */
  _Alignas(64) atomic_uint sleepers; /* this side's threads declared sleepy: the bell is rung for them */
  atomic_uint eager;                  /* this side sleeps without a sleepy while: fence before reading sleepers */
  atomic_uint waiting;                /* this side's threads in (or entering) the futex wait: woken */
} doorbell_t;

typedef struct {
  unsigned char token[RUCCL_SHM_TOKEN_BYTES];
  _Alignas(64) ruccl_shm_ring_t ring[2]; /* [0]: creator -> opener, [1]: opener -> creator */
  doorbell_t door[2];                    /* [0]: the creator's, [1]: the opener's */
} segment_t;

int ruccl_shm_allowed(void) {
  const char *t = getenv("RUCCL_TRANSPORT");
  return !(t && strcmp(t, "tcp") == 0);
}

void ruccl_host_id(char out[RUCCL_HOST_ID_BYTES]) {
  memset(out, 0, 40);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return;
  if (!fgets(out, 40, f)) out[0] = 0;
  fclose(f);
}

static ruccl_result_t map_segment(int fd, ruccl_shm_link_t *l, int creator) {
  void *p = mmap(NULL, sizeof(segment_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ruccl_fail(RUCCL_ERR_IO, "mmap of the shared-memory segment failed");
  segment_t *s = p;
  l->map = p;
  l->map_len = sizeof(segment_t);
  l->tx = &s->ring[creator ? 0 : 1];
  l->rx = &s->ring[creator ? 1 : 0];
  l->side = creator ? 0 : 1;
  return RUCCL_OK;
}

void ruccl_shm_sweep(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int pid = 0, end = 0;
    char hex[17];
    if (sscanf(e->d_name, "ruccl-%d-%16[0-9a-f]%n", &pid, hex, &end) != 2 || e->d_name[end] != 0 || strlen(hex) != 16 ||
        pid <= 0)
      continue;
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    struct stat st;
    if (stat(path, &st) != 0 || st.st_uid != geteuid()) continue; /* another user's: not ours to remove */
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;     /* its creator lives (or may) */
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) ruccl_log(2, "removed the shared-memory segment %s of a process that died", name);
  }
  closedir(d);
}

static pthread_once_t sweep_once = PTHREAD_ONCE_INIT;

ruccl_result_t ruccl_shm_create(ruccl_shm_link_t *l, char name[RUCCL_SHM_NAME_MAX],
                                unsigned char token[RUCCL_SHM_TOKEN_BYTES]) {
  pthread_once(&sweep_once, ruccl_shm_sweep); /* segments a crashed creator left behind */
  unsigned char rnd[8];
  if (RAND_bytes(rnd, sizeof rnd) != 1 || RAND_bytes(token, RUCCL_SHM_TOKEN_BYTES) != 1)
    return ruccl_fail(RUCCL_ERR_IO, "no random bytes for a shared-memory segment");
  snprintf(name, RUCCL_SHM_NAME_MAX, "/ruccl-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(), rnd[0], rnd[1],
           rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return ruccl_fail(RUCCL_ERR_IO, "shm_open(%s) failed", name);
  if (ftruncate(fd, (off_t)sizeof(segment_t)) != 0) {
    close(fd);
    shm_unlink(name);
    return ruccl_fail(RUCCL_ERR_IO, "cannot size the shared-memory segment %s", name);
  }
  ruccl_result_t rc = map_segment(fd, l, 1);
  if (rc != RUCCL_OK) {
    shm_unlink(name);
    return rc;
  }
  segment_t *s = l->map;
  memcpy(s->token, token, RUCCL_SHM_TOKEN_BYTES);
  for (int i = 0; i < 2; i++) {
    atomic_init(&s->ring[i].head, 0);
    atomic_init(&s->ring[i].tail, 0);
    atomic_init(&s->door[i].bell, 0);
    atomic_init(&s->door[i].sleepers, 0);
    atomic_init(&s->door[i].eager, 0);
    atomic_init(&s->door[i].waiting, 0);
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_shm_open(ruccl_shm_link_t *l, const char *name,
                              const unsigned char token[RUCCL_SHM_TOKEN_BYTES]) {
  int fd = shm_open(name, O_RDWR | O_NOFOLLOW, 0600);
  if (fd < 0) return ruccl_fail(RUCCL_ERR_IO, "shm_open(%s) failed: not the same host", name);
  /* A segment of another size would fault (SIGBUS) past its end, or is not ours */
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != (off_t)sizeof(segment_t) ||
      st.st_uid != geteuid()) {
    close(fd);
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "shared-memory segment %s is not a ruccl segment of this user (%lld bytes, %zu expected)",
                      name, (long long)st.st_size, sizeof(segment_t));
  }
  ruccl_result_t rc = map_segment(fd, l, 0);
  if (rc != RUCCL_OK) return rc;
  if (memcmp(((segment_t *)l->map)->token, token, RUCCL_SHM_TOKEN_BYTES) != 0) {
    ruccl_shm_close(l);
    return ruccl_fail(RUCCL_ERR_IO, "shared-memory segment %s is not the one offered", name);
  }
  return RUCCL_OK;
}

void ruccl_shm_unlink(const char *name) { shm_unlink(name); }

void ruccl_shm_close(ruccl_shm_link_t *l) {
  if (l->map) munmap(l->map, l->map_len);
  memset(l, 0, sizeof *l);
}

static doorbell_t *door(const ruccl_shm_link_t *l, int side) { return &((segment_t *)l->map)->door[side]; }

/* After a counter store: rings the other side's bell if it is sleepy, and wakes it
   if it waits.  A sleepy side mostly yields, and a futex wake-up with nobody asleep
   is a system call for nothing (one per message on a crowded host, where a waiting
   side declares itself sleepy at once).  The bump and the look at `waiting` are
   sequentially consistent, as are the sleeper's increment of `waiting` and its read
   of the bell: either the sleeper read the bumped bell (and then sees the counter
   that came before it, and does not sleep), or this side sees it waiting and wakes it. */
static void ring_peer(ruccl_shm_link_t *l) {
  doorbell_t *d = door(l, 1 - l->side);
  if (atomic_load_explicit(&d->eager, memory_order_relaxed)) atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&d->sleepers, memory_order_relaxed) == 0) return;
  atomic_fetch_add(&d->bell, 1);
  if (atomic_load(&d->waiting) == 0) return;
  syscall(SYS_futex, &d->bell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

void ruccl_shm_set_eager(ruccl_shm_link_t *l) { atomic_store(&door(l, l->side)->eager, 1); }

void ruccl_shm_sleepy(ruccl_shm_link_t *l, int delta) { atomic_fetch_add(&door(l, l->side)->sleepers, delta); }

void ruccl_shm_wait(ruccl_shm_link_t *l, int want_read, int want_write, int64_t until_ns) {
  doorbell_t *d = door(l, l->side);
  atomic_fetch_add(&d->waiting, 1); /* before the bell is read (ring_peer) */
  unsigned seen = atomic_load(&d->bell);
  int ready = 0;
  if (want_read) ready |= atomic_load(&l->rx->head) != atomic_load(&l->rx->tail);
  if (want_write) ready |= atomic_load(&l->tx->head) - atomic_load(&l->tx->tail) != RING_BYTES; /* room, or corrupt */
  int64_t left = until_ns - ruccl_now_ns();
  if (!ready && left > 0) {
    struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
    syscall(SYS_futex, &d->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
  }
  atomic_fetch_sub(&d->waiting, 1);
}

size_t ruccl_shm_write(ruccl_shm_link_t *l, const void *buf, size_t len) {
  ruccl_shm_ring_t *r = l->tx;
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  if (head - tail > RING_BYTES) return RUCCL_SHM_CORRUPT; /* the peer's counter is past ours */
  size_t free_bytes = RING_BYTES - (size_t)(head - tail);
  if (len > free_bytes) len = free_bytes;
  if (!len) return 0;
  size_t at = (size_t)(head % RING_BYTES), first = RING_BYTES - at < len ? RING_BYTES - at : len;
  memcpy(r->data + at, buf, first);
  memcpy(r->data, (const char *)buf + first, len - first);
  atomic_store_explicit(&r->head, head + len, memory_order_release);
  ring_peer(l);
  return len;
}

size_t ruccl_shm_peek(ruccl_shm_link_t *l, const void **data) {
  ruccl_shm_ring_t *r = l->rx;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  size_t avail = (size_t)(head - tail), at = (size_t)(tail % RING_BYTES);
  *data = r->data + at;
  if (avail > RING_BYTES) return RUCCL_SHM_CORRUPT; /* more than a ring holds: a counter is wrong */
  return RING_BYTES - at < avail ? RING_BYTES - at : avail;
}

void ruccl_shm_consume(ruccl_shm_link_t *l, size_t len) {
  ruccl_shm_ring_t *r = l->rx;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  atomic_store_explicit(&r->tail, tail + len, memory_order_release);
  ring_peer(l);
}

size_t ruccl_shm_read(ruccl_shm_link_t *l, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) { /* at most twice: up to the ring's end, then from its start */
    const void *data;
    size_t n = ruccl_shm_peek(l, &data);
    if (n == RUCCL_SHM_CORRUPT) return n;
    if (!n) break;
    if (n > len - got) n = len - got;
    memcpy((char *)buf + got, data, n);
    ruccl_shm_consume(l, n);
    got += n;
  }
  return got;
}

void ruccl_shm_testing_corrupt(ruccl_shm_link_t *l, int which) {
  ruccl_shm_ring_t *r = which == 0 ? l->tx : l->rx;
  if (which == 0) atomic_fetch_add(&r->tail, (uint64_t)RING_BYTES * 3); /* the reader "read" more than was written */
  else atomic_fetch_add(&r->head, (uint64_t)RING_BYTES * 2);           /* the writer "wrote" past a whole ring */
}

void ruccl_shm_testing_set_counter(ruccl_shm_link_t *l, int which, uint64_t value) {
  ruccl_shm_ring_t *r = which < 2 ? l->tx : l->rx;
  atomic_store(which % 2 == 0 ? &r->head : &r->tail, value);
}
