//===- Plugin.cpp - registers bunkai-flow-jp with clang-14 and opt-14 -------===//
//
// clang-14 -fpass-plugin=BunkaiFlow.so: the pass runs at OptimizerLastEP,
// after every IR optimisation of the level (-O0 included).
// opt-14 -load-pass-plugin=BunkaiFlow.so -passes='bunkai-flow-jp<PARAMS>':
// PARAMS as in Options::parse, overriding -bunkai-flow-* options.
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
using namespace bunkai::flow;

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "BunkaiFlow", "1", [](PassBuilder &PB) {
            PB.registerOptimizerLastEPCallback(
                [](ModulePassManager &MPM, OptimizationLevel) {
                  MPM.addPass(JoinPointsPass(Options::fromCommandLine()));
                });
            PB.registerPipelineParsingCallback(
                [](StringRef Name, ModulePassManager &MPM,
                   ArrayRef<PassBuilder::PipelineElement>) {
                  if (!Name.consume_front("bunkai-flow-jp"))
                    return false;
                  Options O = Options::fromCommandLine();
                  if (!Name.empty()) {
                    if (!Name.consume_front("<") || !Name.consume_back(">"))
                      return false;
                    std::string Err = O.parse(Name);
                    if (!Err.empty()) {
                      errs() << "bunkai-flow-jp: " << Err << "\n";
                      return false;
                    }
                  }
                  MPM.addPass(JoinPointsPass(std::move(O)));
                  return true;
                });
          }};
}
