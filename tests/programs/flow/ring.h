/* ring.h: the structs of ring.c (the advice that packs the flow ID into a
 * request header is compiled with this header: --cflags "-include ring.h"). */
#include <stdint.h>
struct pkt {
  unsigned len;
  unsigned flags;
  char data[48];
};
struct tx_req {
  uint32_t gref;
  uint16_t offset;
  uint16_t size;
#ifdef RING_TAG_BITFIELD /* the same layout, but offsetof(tag) does not compile */
  uint64_t tag : 64;
#else
  uint64_t tag; /* bit 0: more data; bits 8..63: the flow ID while it crosses */
#endif
};
struct slot {
  struct tx_req req;
  char payload[48];
};
