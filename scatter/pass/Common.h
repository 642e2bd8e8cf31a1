//===- Common.h - state shared by the scatter passes ------------------------===//
//
// The scatter passes talk to each other through string function attributes
// (they survive llvm-link and bitcode round trips):
//   "bunkai-src"   source file of a function (set per translation unit)
//   "bunkai-name"  the function's name before any renaming
//   "bunkai-id"    its function id (hex) when it will be extracted
//   "bunkai-keep"  why it stays in the launcher, when it will not
//
// Ownership (§3.1/§3.2 of the paper): a global variable "belongs" to the set
// of extracted functions that reach it, directly or through the initialisers
// of other globals. A non-public variable with exactly one owner moves into
// that function's library; one with several owners (or used by code or data
// that stays in the launcher) stays in the launcher and is exposed.
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_SCATTER_PASS_COMMON_H
#define BUNKAI_SCATTER_PASS_COMMON_H

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/Instruction.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include "../include/bunkai_scatter.h"

#include <set>
#include <vector>
#include <string>

namespace bunkai {

inline std::string hex(unsigned V) {
  return llvm::utohexstr(V, /*LowerCase=*/true);
}

inline bool hasId(const llvm::Function &F) {
  return F.hasFnAttribute("bunkai-id");
}

inline unsigned idOf(const llvm::Function &F) {
  unsigned V = 0;
  F.getFnAttribute("bunkai-id").getValueAsString().getAsInteger(16, V);
  return V;
}

inline std::string originalName(const llvm::Function &F) {
  if (F.hasFnAttribute("bunkai-name"))
    return F.getFnAttribute("bunkai-name").getValueAsString().str();
  return F.getName().str();
}

// A symbol other code could bind to by name: external (or common/weak)
// linkage and not hidden. Everything else is "non-public" in the paper's
// sense and may be renamed, merged or moved.
inline bool isPublic(const llvm::GlobalValue &GV) {
  return !GV.hasLocalLinkage() && !GV.hasHiddenVisibility();
}

// Names in llvm.used / llvm.compiler.used: the program may refer to them
// from assembly, so they keep their names and place.
std::set<const llvm::GlobalValue *> usedSet(const llvm::Module &M);

// The decision log: one line per decision, appended to -bunkai-log=FILE
// (or discarded). Lines are "<pass>\t<kind>\t<fields...>".
llvm::raw_ostream &log();

// Owner analysis over global variables. Variables that point at each other
// (a table and its strings, a self-referencing list head) form strongly
// connected components that move or stay together; components are solved
// from their users down, so a string in a table belongs to whoever owns the
// table.
class Owners {
public:
  // Launcher stands for "code or data that stays in the launcher".
  static constexpr const llvm::Function *Launcher = nullptr;

  explicit Owners(const llvm::Module &M);

  // The owners of GV: extracted functions, or Launcher.
  const std::set<const llvm::Function *> &of(const llvm::GlobalVariable &GV);

  // The single extracted function that owns GV, when GV may move with it.
  const llvm::Function *soleOwner(const llvm::GlobalVariable &GV);

  // Why GV may not move at all, or empty when it may.
  std::string pinnedReason(const llvm::GlobalVariable &GV) const;

private:
  std::set<const llvm::GlobalValue *> Used;
  llvm::DenseMap<const llvm::GlobalVariable *, unsigned> Comp;
  std::vector<std::set<const llvm::Function *>> CompOwners;
  std::vector<bool> CompPinned;
};

} // namespace bunkai

#endif
