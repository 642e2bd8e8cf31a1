/* bk_out.c: the plugin's output: growable buffers, LEB128 varints, and the
 * Unix socket to `bunkai trace record --system`, over which it sends the
 * messages of trace/include/bunkai_trace.h (u8 kind, three zero bytes, u32
 * length, payload). DEFS always go before the EVENTS that use them.
 *
 * Rules: see bk_qemu.h. A write error (the recorder went away) stops all
 * further output; it never stops the guest.
 */
#include "bk_qemu.h"
#include "bunkai_trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

bk_buf bk_defs, bk_events;
uint64_t bk_prev_seg, bk_prev_addr;
bk_packed bk_pk;
static int bk_fd = -1;

static void bk_reserve(bk_buf *b, size_t more)
{
    if (b->n + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap * 2 : 1 << 16;
    while (cap < b->n + more)
        cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p)
        abort();
    b->cap = cap;
}

void bk_put_v(bk_buf *b, uint64_t v)
{
    bk_reserve(b, 10);
    while (v >= 0x80) {
        b->p[b->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (uint8_t)v;
}

void bk_put_z(bk_buf *b, int64_t v)
{
    bk_put_v(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

void bk_put_bytes(bk_buf *b, const void *p, size_t n)
{
    bk_reserve(b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void bk_put_s(bk_buf *b, const char *s)
{
    size_t n = strlen(s);
    bk_put_v(b, n);
    bk_put_bytes(b, s, n);
}

int bk_out_connect(const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path)
        return -1;
    strcpy(a.sun_path, path);
    bk_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bk_fd < 0)
        return -1;
    if (connect(bk_fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(bk_fd);
        bk_fd = -1;
        return -1;
    }
    return 0;
}

static void bk_write_all(const uint8_t *p, size_t n)
{
    while (n > 0 && bk_fd >= 0) {
        ssize_t k = write(bk_fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            close(bk_fd);
            bk_fd = -1;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

void bk_out_send(int kind, const bk_buf *b)
{
    uint8_t h[8] = {(uint8_t)kind, 0, 0, 0};
    uint32_t len = (uint32_t)b->n;
    memcpy(h + 4, &len, 4);
    bk_write_all(h, 8);
    bk_write_all(b->p, b->n);
}

void bk_out_flush(void)
{
    if (bk_defs.n) {
        bk_out_send(BKT_CHUNK_DEFS, &bk_defs);
        bk_defs.n = 0;
        memset(&bk_pk, 0, sizeof bk_pk);
    }
    if (bk_events.n) {
        bk_out_send(BKT_CHUNK_EVENTS, &bk_events);
        bk_events.n = 0;
    }
    bk_prev_seg = 0;
    bk_prev_addr = 0;
}

void bk_out_close(void)
{
    if (bk_fd >= 0)
        close(bk_fd);
    bk_fd = -1;
}

uint64_t bk_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
