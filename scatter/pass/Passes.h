//===- Passes.h - the scatter passes (one per file) -------------------------===//
//
// Pipeline, in this order (the driver runs it with opt-14):
//   per translation unit:  bunkai-tag-source
//   on the linked module:  bunkai-hide-unexported,
//                          bunkai-assign-ids, bunkai-externalize,
//                          bunkai-merge-statics, bunkai-split
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_SCATTER_PASSES_H
#define BUNKAI_SCATTER_PASSES_H

#include "llvm/IR/PassManager.h"

namespace bunkai {

// Record each function's source file before modules are linked (§4.2).
struct TagSourcePass : llvm::PassInfoMixin<TagSourcePass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

// Hide what the original does not export (--lib: a version script's local
// names; an executable: its variables, -bunkai-hide-data-only), so the other
// passes treat it as non-public.
struct HideUnexportedPass : llvm::PassInfoMixin<HideUnexportedPass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

// Decide which functions are extracted; give each an id (§3.1, §4.5).
struct AssignIdsPass : llvm::PassInfoMixin<AssignIdsPass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

// Make non-public functions visible under unique short names (§4.3).
struct ExternalizePass : llvm::PassInfoMixin<ExternalizePass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

// Merge non-public variables used by several functions into exported
// structs reached by field index and offset (§3.2, §4.4).
struct MergeStaticsPass : llvm::PassInfoMixin<MergeStaticsPass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

// Move every extracted function, with the data only it uses, into a module
// of its own; leave the launcher module behind (§3.1, §4.5, §4.6).
struct SplitPass : llvm::PassInfoMixin<SplitPass> {
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

} // namespace bunkai

#endif
