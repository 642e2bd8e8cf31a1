//===- Sled.h - one join point's sled and record, as inline assembly --------===//
//
// A join point becomes one `call void asm sideeffect` before its
// instruction. The template is the 11-byte unpatched sled of
// bunkai_flow.h, then (in BKF_SECTION) the record whose text names each
// operand beside the location the compiler chose for it; the compiler fills
// the locations in when it prints the template, so the table says where
// $base, $argN and every named variable are at the sled's first byte
// without any stack map. Sample record text (tabs shown as \t):
//
//   pkt\tlen\tpkt_clone\tpackets.c\t36\tload\t32\t$base=%rbx skb=%rbx n=%rax
//
// The asm clobbers nothing, flags included: an unpatched sled is one
// 11-byte nop (plus a 1-byte nop when it needs aligning), and a trampoline
// saves what it touches. Without side effects
// the asm would be deleted (it has no outputs); with them, the machine
// scheduler does not move memory operations across it.
//
// Constraints. LLVM 14 resolves a multi-alternative "rm" or "g" to memory
// every time: a value already in a register is stored to a fresh stack
// slot before the sled, and a spilled one is reloaded and stored again.
// "r" costs nothing for a value in a register and one reload for a
// spilled one, so integers and pointers use "r", float and double "x"
// (%xmmN), and integer constants "i" ($N, no register at all). Symbolic
// constants (a global's address) would print as an absolute symbol and
// need a dynamic relocation in the record, so they go in a register too.
// At most MaxRegs operands take general registers and MaxRegs take %xmm
// registers, in the order given ($base or $argN first); a value named twice
// is one operand printed twice.
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_FLOW_SLED_H
#define BUNKAI_FLOW_SLED_H

#include "llvm/IR/Instruction.h"

#include <string>
#include <vector>

namespace bunkai::flow {

struct Record {
  unsigned Kind;          // BKF_KIND_ACCESS, _ENTRY, _AFTER or _EXIT
  std::string Struct;     // "-" for an entry
  std::string Member;     // "-" for an entry
  std::string Function;   // source name
  std::string File;
  unsigned Line = 0;
  std::string Access;     // load, store, addr, entry or exit
  uint64_t Bits = 0;      // the member's width (0 for an entry)
};

struct Operand {
  std::string Name;       // "$base", "$arg0", or a C variable
  llvm::Value *V;
};

// Inserts the sled before InsertPt. Returns how many operands were left out
// (register limit or a type no register holds).
unsigned insertSled(llvm::Instruction *InsertPt, const Record &R,
                    const std::vector<Operand> &Ops, unsigned MaxRegs);

} // namespace bunkai::flow

#endif
