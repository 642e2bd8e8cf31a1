/*
 * preload.c - the one constructor of libbunkai-host.so, for hosts that get
 * the library through LD_PRELOAD instead of linking it: with BUNKAI_HOST=1
 * in the environment it starts the command thread (socket from
 * BUNKAI_HOST_SOCKET, or the default). Without it, it does nothing, so
 * linking the shared library never changes a program's behaviour.
 * Rules: host.h; nothing else runs at load time.
 */
#include "../include/bunkai_mod.h"

#include <stdlib.h>

__attribute__((constructor)) static void bunkai_host_preload(void) {
  const char *v = getenv("BUNKAI_HOST");
  if (v && v[0] == '1' && v[1] == 0)
    bunkai_host_start(NULL); /* a failure is one line on stderr, from it */
}
