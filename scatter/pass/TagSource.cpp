//===- TagSource.cpp - remember each function's source file ----------------===//
//
// Run on every translation unit before llvm-link: after linking, a module
// has one source_filename for all its functions. Debug info wins when there
// is any (whole-program bitcode from an LTO build names "ld-temp.o").
//===----------------------------------------------------------------------===//
#include "Common.h"
#include "Passes.h"

#include "llvm/IR/DebugInfoMetadata.h"

using namespace llvm;

namespace bunkai {

PreservedAnalyses TagSourcePass::run(Module &M, ModuleAnalysisManager &) {
  for (Function &F : M) {
    if (F.isDeclaration() || F.hasFnAttribute("bunkai-src"))
      continue;
    std::string Src = M.getSourceFileName();
    if (const DISubprogram *SP = F.getSubprogram())
      if (!SP->getFilename().empty())
        Src = SP->getFilename().str();
    F.addFnAttr("bunkai-src", Src);
  }
  return PreservedAnalyses::none();
}

} // namespace bunkai
