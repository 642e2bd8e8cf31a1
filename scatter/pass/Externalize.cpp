//===- Externalize.cpp - give non-public functions unique public names -----===//
//
// §4.3: a library reaches another function through that function's stub in
// the launcher, by symbol name, so every function a library might call must
// be visible. Static and hidden functions get short unique names derived
// from their id (the paper used "$<hex>"); two static functions called
// "helper" in different files can no longer collide. Public functions keep
// their names: the stub stands in for them under the same name (§3.3).
// Local aliases are made visible the same way.
//===----------------------------------------------------------------------===//
#include "Common.h"
#include "Passes.h"

#include "llvm/IR/GlobalAlias.h"

using namespace llvm;

namespace bunkai {

static void makeVisible(GlobalValue &GV, const std::string &Name) {
  log() << "externalize\trename\t" << GV.getName() << "\t" << Name << "\n";
  GV.setName(Name);
  GV.setLinkage(GlobalValue::ExternalLinkage);
  GV.setVisibility(GlobalValue::DefaultVisibility);
  GV.setUnnamedAddr(GlobalValue::UnnamedAddr::None);
}

PreservedAnalyses ExternalizePass::run(Module &M, ModuleAnalysisManager &) {
  std::set<const GlobalValue *> Used = usedSet(M);
  unsigned Kept = 0;
  for (Function &F : M) {
    if (F.isDeclaration() || isPublic(F))
      continue;
    if (hasId(F)) {
      makeVisible(F, BUNKAI_STUB_PREFIX + hex(idOf(F)));
    } else if (Used.count(&F)) {
      // Assembly may name it: keep the name, only make it visible.
      makeVisible(F, F.getName().str());
    } else {
      // Kept in the launcher, but a library may still call it.
      makeVisible(F, BUNKAI_KEPT_PREFIX + hex(Kept++));
    }
  }
  unsigned Aliases = 0;
  for (GlobalAlias &A : M.aliases())
    if (!isPublic(A) && !Used.count(&A))
      makeVisible(A, std::string(BUNKAI_GLOBAL_PREFIX) + "a" + hex(Aliases++));
  return PreservedAnalyses::none();
}

} // namespace bunkai
