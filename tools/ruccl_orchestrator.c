/* ruccl_orchestrator.c — the program `ruccl-orchestrator --listen HOST:PORT
 * [--secret-file FILE]`: runs the multi-node rendezvous server until SIGINT or
 * SIGTERM.  The secret comes from --secret-file, else from RUCCL_SECRET, else from
 * the file RUCCL_SECRET_FILE names; without one it refuses to start.  It prints the address it bound ("listening on HOST:PORT") once ready. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "ruccl.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

static int usage(void) {
  fprintf(stderr, "usage: ruccl-orchestrator --listen HOST:PORT [--secret-file FILE]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *listen = NULL, *secret_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--listen") && i + 1 < argc) listen = argv[++i];
    else if (!strcmp(argv[i], "--secret-file") && i + 1 < argc) secret_file = argv[++i];
    else return usage();
  }
  if (!listen) return usage();
  unsigned char secret[RUCCL_MAX_SECRET];
  size_t secret_len = 0; /* none given: the environment's, else the orchestrator refuses to start */
  if (secret_file && ruccl_secret_from_file(secret_file, secret, &secret_len) != RUCCL_OK) {
    fprintf(stderr, "ruccl-orchestrator: %s\n", ruccl_last_error());
    return 1;
  }
  ruccl_orchestrator_t *o;
  ruccl_result_t rc = ruccl_orchestrator_start(listen, secret, secret_len, &o);
  OPENSSL_cleanse(secret, sizeof secret);
  if (rc != RUCCL_OK) {
    fprintf(stderr, "ruccl-orchestrator: %s\n", ruccl_last_error());
    return 1;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  char host[RUCCL_MAX_ADDRESS];
  snprintf(host, sizeof host, "%s", listen);
  char *colon = strrchr(host, ':');
  if (colon) *colon = 0;
  printf("listening on %s:%d\n", host, ruccl_orchestrator_port(o));
  fflush(stdout);
  while (!stop_requested) pause();
  ruccl_orchestrator_stop(o);
  return 0;
}
