/*
 * bunkai_scatter.h - the one interface shared by the scatter tool (Rust
 * driver, LLVM passes) and the scatter runtime that lives in the launcher.
 *
 * Bump BUNKAI_SCATTER_VERSION whenever a name, a file layout or the meaning
 * of a generated symbol below changes: the driver stamps it into
 * manifest.json ("abi") and into the launcher (__bunkai_abi), and the Rust
 * side has a test that compiles this header so the two cannot drift apart.
 * The group map has a version of its own, BUNKAI_GROUP_VERSION (below).
 *
 * Layout of a scatter output directory OUT for program NAME:
 *   OUT/bin/NAME                 the launcher (or OUT/lib/libNAME.so, --lib)
 *   OUT/lib/NAME/f<hex>.so        one library per function, <hex> = id
 *   OUT/lib/NAME/functions.tsv    "<hex id>\t<original name>\t<source>\n";
 *                                 read by the runtime only to name a function
 *                                 in an error message
 *   OUT/manifest.json            written by the driver, read by `bunkai scatter stats`
 *   OUT/bc/NAME/f<hex>.bc         each function's module, kept so that
 *                                 `bunkai scatter group` can link groups (§5.1)
 *   OUT/original/NAME            the original program, stripped
 *
 * Added by `bunkai scatter profile` and `bunkai scatter group` (§5, §6):
 *   OUT/profile                  first-call order (text, see profile.rs)
 *   OUT/lib/NAME/g<hex>.so        one library per group, <hex> = group id
 *   OUT/lib/NAME/g<hex>.so.zst    the same, zstd-compressed (for the network)
 *   OUT/lib/NAME/groups.dict      the zstd dictionary of the .zst groups (if
 *                                 it pays for itself)
 *   OUT/lib/NAME/groups.map(.zst) the group map file (binary, below); the
 *                                 manager uses groups when it exists
 *   OUT/bin/NAME.zst             the launcher, compressed (--lib: lib/...)
 *   OUT/remote.json              the small index `bunkai scatter run` fetches first
 *
 * Symbols (all ids in lower-case hex, no leading zeros):
 *   __bunkai_f<hex>   the body of function <hex>, exported by its library
 *   __bunkai_s<hex>   stub of a non-public (static or hidden) function
 *   __bunkai_k<hex>   non-public function kept in the launcher, exported
 *   __bunkai_g<hex>   non-public global exported as itself (TLS, sections)
 *   __bunkai_data / __bunkai_rodata / __bunkai_bss
 *                     non-public variables used by several functions, merged
 *                     into one struct each and reached by field index (§3.2)
 * Generated into the launcher by the driver (stubs.S):
 *   __bunkai_got      one slot per function id; the stubs jump through it
 *   __bunkai_stubs    the stubs, 8 bytes apart, in id order
 *   __bunkai_lazy     the lazy entries, 5 bytes apart, in id order
 *   __bunkai_nfuncs   number of slots
 *   __bunkai_libdir   library directory relative to the launcher's directory
 *   __bunkai_is_lib   1 when the launcher is a shared library
 *   __bunkai_abi      BUNKAI_SCATTER_VERSION at generation time
 */
#ifndef BUNKAI_SCATTER_H
#define BUNKAI_SCATTER_H

#include <stdint.h>

#define BUNKAI_SCATTER_VERSION 5

#define BUNKAI_BODY_PREFIX "__bunkai_f"
#define BUNKAI_STUB_PREFIX "__bunkai_s"
#define BUNKAI_KEPT_PREFIX "__bunkai_k"
#define BUNKAI_GLOBAL_PREFIX "__bunkai_g"
#define BUNKAI_LIB_PREFIX "f"
#define BUNKAI_LIB_SUFFIX ".so"
#define BUNKAI_NAMES_FILE "functions.tsv"
#define BUNKAI_GROUP_PREFIX "g"
#define BUNKAI_GROUP_MAP "groups.map"
#define BUNKAI_ZST_SUFFIX ".zst"

/* The group map file, all integers little-endian:
 *   char     magic[8]            BUNKAI_GROUP_MAGIC
 *   uint32_t nfuncs              must equal the launcher's __bunkai_nfuncs
 *   uint32_t ngroups             >= 1
 *   uint32_t group_of[nfuncs]    group id of each function id, < ngroups
 *   uint32_t slot_of[nfuncs]     the function's index in its group's table
 *   struct bunkai_group groups[ngroups]
 *   uint64_t check               FNV-1a (64-bit) of every byte before it
 * A group library exports one symbol, BUNKAI_GROUP_TABLE: int32 offsets,
 * from the table itself, of its functions' bodies in slot order.
 * The manager checks every field before using it; the check word catches a
 * damaged map whose fields are each plausible (a slot moved to another
 * valid slot would call the wrong function).
 * The map's version is BUNKAI_GROUP_VERSION, one digit, the magic's last
 * character ("BKGROUP4"): a map of another version is refused. */
#define BUNKAI_GROUP_VERSION 4
#define BUNKAI_SCATTER__STR(x) #x
#define BUNKAI_SCATTER__XSTR(x) BUNKAI_SCATTER__STR(x)
#define BUNKAI_GROUP_MAGIC "BKGROUP" BUNKAI_SCATTER__XSTR(BUNKAI_GROUP_VERSION)
#define BUNKAI_GROUP_TABLE "__bunkai_gtab"
/* A function or group library that calls functions of other libraries also
 * exports its slots for them (issue 23): BUNKAI_LIB_IMPORTS, one pointer
 * per callee, called through by the library's code and first pointing at
 * the callee's stub; and BUNKAI_LIB_IMPORT_IDS, uint32: the number of slots,
 * then each slot's function id, strictly increasing. The manager points a
 * slot at the callee's body once both are loaded, so a call between
 * libraries costs one indirect call, as in -fno-plt code. Calls inside a
 * group are direct. */
#define BUNKAI_LIB_IMPORTS "__bunkai_gimp"
#define BUNKAI_LIB_IMPORT_IDS "__bunkai_gids"
struct bunkai_group {
  uint64_t raw_bytes;        /* size of g<hex>.so */
  uint64_t zst_bytes;        /* size of g<hex>.so.zst */
  uint8_t raw_sha256[32];    /* of g<hex>.so: what runs is what was built */
};

/* Environment the manager reads in its constructor:
 *   BUNKAI_PROFILE=PATH   append "<hex id>\n" to PATH at each first call;
 *                         forces per-function libraries (`bunkai scatter profile`)
 *   BUNKAI_ORIGIN=URL     the library directory on an HTTP origin (ends with
 *                         '/'); groups missing locally are fetched from it by
 *                         the fetch library (`bunkai scatter run` sets these)
 *   BUNKAI_FETCH=PATH     the fetch library (libbunkai-fetch.so)
 *   BUNKAI_PRELOAD=0|1    start the preload thread (§6.2), default 1
 *   BUNKAI_COMPRESS=0|1   fetch g<hex>.so.zst and decompress, default 1
 *   BUNKAI_FETCH_LOG=PATH one line per fetched group, for -v and benches:
 *                         "<ms since start>\t<group hex>\t<preload|demand>\t<bytes>"
 */

/* The fetch library's entry points (looked up with dlsym). */
struct bunkai_fetch_config {
  uint32_t abi;              /* BUNKAI_SCATTER_VERSION */
  const char *libdir;        /* local library directory, ends with '/' */
  const char *origin;        /* BUNKAI_ORIGIN */
  uint32_t ngroups;
  const struct bunkai_group *groups;
  int preload, compress;
  const char *log_path;      /* BUNKAI_FETCH_LOG or NULL */
};
/* Starts the preload thread (when asked). 0 on success, else -1 with a
 * message in err. */
typedef int (*bunkai_fetch_start_fn)(const struct bunkai_fetch_config *,
                                     char *err, unsigned long errlen);
/* Returns 0 once libdir/g<group>.so exists and matches its checksum,
 * fetching it at once if the preloader has not reached it; -1 with a message
 * after the retries failed. */
typedef int (*bunkai_fetch_wait_fn)(uint32_t group, char *err,
                                    unsigned long errlen);
#define BUNKAI_FETCH_START "__bunkai_fetch_start"
#define BUNKAI_FETCH_WAIT "__bunkai_fetch_wait"

/* A stub is `jmpq *__bunkai_got+8*id(%rip)`: 6 bytes, 8-aligned, stub id at
 * __bunkai_stubs + 8 * id. Its slot first holds the function's lazy entry,
 * `call __bunkai_resolve` at __bunkai_lazy + 5 * id, whose return address
 * gives the trampoline the id without touching any argument register; once
 * loaded, the slot holds the body (a PLT entry after lazy binding). */

#endif
