//===- Plugin.cpp - registers the scatter passes with opt-14 ----------------===//
#include "Passes.h"

#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"

using namespace llvm;

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "BunkaiScatter", "1",
          [](PassBuilder &PB) {
            // Loaded into clang (-fpass-plugin), the plugin tags every
            // function with its source as the last pass of the optimisation
            // pipeline, at every level: the bitcode clang writes is the
            // tagged one, with no second read and write of it in opt. opt
            // runs the passes by name (below), where this does not apply.
            PB.registerOptimizerLastEPCallback(
                [](ModulePassManager &MPM, OptimizationLevel) {
                  MPM.addPass(bunkai::TagSourcePass());
                });
            PB.registerPipelineParsingCallback(
                [](StringRef Name, ModulePassManager &MPM,
                   ArrayRef<PassBuilder::PipelineElement>) {
                  if (Name == "bunkai-tag-source")
                    MPM.addPass(bunkai::TagSourcePass());
                  else if (Name == "bunkai-hide-unexported")
                    MPM.addPass(bunkai::HideUnexportedPass());
                  else if (Name == "bunkai-assign-ids")
                    MPM.addPass(bunkai::AssignIdsPass());
                  else if (Name == "bunkai-externalize")
                    MPM.addPass(bunkai::ExternalizePass());
                  else if (Name == "bunkai-merge-statics")
                    MPM.addPass(bunkai::MergeStaticsPass());
                  else if (Name == "bunkai-split")
                    MPM.addPass(bunkai::SplitPass());
                  else
                    return false;
                  return true;
                });
          }};
}
