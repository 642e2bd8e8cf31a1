/* splitdrv.h: the structs of splitdrv.c. Advice that packs a flow ID into a
 * request header is compiled with it: --cflags "-include splitdrv.h". */
#include <stdint.h>
#define RING_SLOTS 64
struct sk_buff {
  unsigned len;
  unsigned csum;
  unsigned cloned;
  char *data;
  char head[128];
};
struct netif_tx_request { /* as in Xen's io/netif.h */
  uint32_t gref;
  uint16_t offset;
  uint16_t flags; /* bits 0-3: NETTXF_*; bits 4-15 carry a flow ID across */
  uint16_t id;
  uint16_t size;
};
struct ring {
  unsigned prod, cons;
  struct {
    struct netif_tx_request req;
    char data[128];
  } slot[RING_SLOTS];
};
