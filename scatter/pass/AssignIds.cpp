//===- AssignIds.cpp - choose the functions to extract and number them -----===//
//
// Every defined function is extracted unless something outside the IR may
// name it or its address in a way a stub cannot stand in for:
//   - it is in llvm.used / llvm.compiler.used (assembly may call it by name),
//   - an alias or ifunc points at it (an alias needs a definition beside it),
//   - a blockaddress of it escapes into other functions or data,
//   - it has an explicit section (collected by a linker script or section
//     bounds such as __start_foo), or module-level asm mentions it,
//   - it is available_externally (its real definition lives elsewhere).
// Ids are dense, in module order, so the driver and the runtime can index
// tables by id.
//===----------------------------------------------------------------------===//
#include "Common.h"
#include "Passes.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/GlobalAlias.h"
#include "llvm/IR/GlobalIFunc.h"

using namespace llvm;

namespace bunkai {

static bool blockAddressEscapes(const Function &F) {
  for (const BasicBlock &BB : F) {
    if (!BB.hasAddressTaken())
      continue;
    const BlockAddress *BA = BlockAddress::lookup(&BB);
    if (!BA)
      continue;
    for (const User *U : BA->users()) {
      const auto *I = dyn_cast<Instruction>(U);
      if (!I || I->getFunction() != &F)
        return true;
    }
  }
  return false;
}

static std::string keepReason(const Function &F,
                              const std::set<const GlobalValue *> &Used,
                              const std::set<const GlobalValue *> &Aliased,
                              StringRef ModuleAsm) {
  if (F.hasAvailableExternallyLinkage())
    return "available_externally: defined elsewhere";
  if (F.getName().startswith("llvm."))
    return "llvm intrinsic";
  if (Used.count(&F))
    return "marked used: assembly may name it";
  if (Aliased.count(&F))
    return "target of an alias or ifunc";
  if (F.hasSection())
    return "explicit section " + F.getSection().str();
  if (blockAddressEscapes(F))
    return "label address used outside the function";
  if (!ModuleAsm.empty() && ModuleAsm.contains(F.getName()))
    return "named in module-level assembly";
  return "";
}

PreservedAnalyses AssignIdsPass::run(Module &M, ModuleAnalysisManager &) {
  std::set<const GlobalValue *> Used = usedSet(M);
  std::set<const GlobalValue *> Aliased;
  for (const GlobalAlias &A : M.aliases())
    if (const auto *G = dyn_cast<GlobalValue>(A.getAliasee()->stripPointerCasts()))
      Aliased.insert(G);
  for (const GlobalIFunc &I : M.ifuncs())
    if (const auto *G = dyn_cast<GlobalValue>(I.getResolver()->stripPointerCasts()))
      Aliased.insert(G);
  const std::string &Asm = M.getModuleInlineAsm();

  unsigned Next = 0;
  for (Function &F : M) {
    if (F.isDeclaration())
      continue;
    F.addFnAttr("bunkai-name", F.getName());
    std::string Why = keepReason(F, Used, Aliased, Asm);
    if (Why.empty()) {
      F.addFnAttr("bunkai-id", hex(Next++));
    } else {
      F.addFnAttr("bunkai-keep", Why);
      log() << "ids\tkeep\t" << F.getName() << "\t" << Why << "\n";
    }
  }
  log() << "ids\tcount\t" << Next << "\n";
  return PreservedAnalyses::none();
}

} // namespace bunkai
