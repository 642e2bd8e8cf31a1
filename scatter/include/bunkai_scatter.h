/*
 * bunkai_scatter.h - the one interface shared by the scatter tool (Rust
 * driver, LLVM passes) and the scatter runtime that lives in the launcher.
 *
 * Bump BUNKAI_SCATTER_ABI whenever a name, a file layout or the meaning of a
 * generated symbol below changes: the driver stamps it into manifest.json and
 * into the launcher (__bunkai_abi), and the Rust side has a test that reads
 * this header so the two cannot drift apart.
 *
 * Layout of a scatter output directory OUT for program NAME:
 *   OUT/bin/NAME                 the launcher (or OUT/lib/libNAME.so, --lib)
 *   OUT/lib/NAME/f<hex>.so        one library per function, <hex> = id
 *   OUT/lib/NAME/functions.tsv    "<hex id>\t<original name>\t<source>\n";
 *                                 read by the runtime only to name a function
 *                                 in an error message
 *   OUT/manifest.json            written by the driver, read by `bunkai stats`
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
 *   __bunkai_nfuncs   number of slots
 *   __bunkai_libdir   library directory relative to the launcher's directory
 *   __bunkai_is_lib   1 when the launcher is a shared library
 *   __bunkai_abi      BUNKAI_SCATTER_ABI at generation time
 */
#ifndef BUNKAI_SCATTER_H
#define BUNKAI_SCATTER_H

#define BUNKAI_SCATTER_ABI 1

#define BUNKAI_BODY_PREFIX "__bunkai_f"
#define BUNKAI_STUB_PREFIX "__bunkai_s"
#define BUNKAI_KEPT_PREFIX "__bunkai_k"
#define BUNKAI_GLOBAL_PREFIX "__bunkai_g"
#define BUNKAI_LIB_PREFIX "f"
#define BUNKAI_LIB_SUFFIX ".so"
#define BUNKAI_NAMES_FILE "functions.tsv"

/* A stub is `movl $id, %r11d; jmpq *__bunkai_got+8*id(%rip)`: 12 bytes,
 * aligned to 16. %r11 is a scratch register that carries no argument in the
 * x86-64 System V ABI, so the id reaches __bunkai_resolve without touching
 * the caller's arguments. */
#define BUNKAI_STUB_ID_REG "r11"

#endif
